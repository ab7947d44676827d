"""Building a wheel with the project's own backend in this Python (module_utils/python_build.py), and
overlay_build's answers when it cannot."""

import sys
import zipfile
from importlib import metadata

import pytest
from conftest import REPO_ROOT, run_module

from ansible_collections.ddtree.sglang.plugins.module_utils.python_build import (
    build_system,
    build_wheel,
    unmet_requirements,
)
from ansible_collections.ddtree.sglang.plugins.modules import overlay_build


def test_build_system_reads_the_backend_and_its_requirements():
    system = build_system((REPO_ROOT / "sglang_overlay" / "pyproject.toml").read_text())
    assert system["build-backend"] == "setuptools.build_meta"
    assert system["requires"] == ["setuptools>=77"]


def test_build_system_without_a_backend_is_pep_517s_default():
    assert build_system('[project]\nname = "x"\n')["build-backend"] == "setuptools.build_meta:__legacy__"
    assert build_system('[build-system]\nrequires = ["setuptools>=70"]\n') == {
        "requires": ["setuptools>=70"],
        "build-backend": "setuptools.build_meta:__legacy__",
        "backend-path": None,
    }
    assert build_system('[project]\nname = "x"\n')["requires"] == ["setuptools>=40.8.0"]


def test_build_system_names_a_broken_file():
    with pytest.raises(ValueError):
        build_system("[build-system\n")


def versions(**installed):
    def version(name):
        if name not in installed:
            raise metadata.PackageNotFoundError(name)
        return installed[name]

    return version


def test_unmet_requirements_name_the_missing_and_the_too_old():
    assert unmet_requirements(
        ["setuptools>=77", "wheel", "flit_core>=3.2,<4"], versions(setuptools="84.2.1", flit_core="3.9.0")
    ) == ["wheel (not installed)"]
    assert unmet_requirements(["setuptools>=77"], versions(setuptools="65.5.0")) == [
        "setuptools>=77 (installed: 65.5.0)"
    ]
    assert unmet_requirements(["setuptools>=77 ; python_version < '3'"], versions()) == []
    assert unmet_requirements(["not a requirement!"], versions())[0].startswith(
        "not a requirement! (not a valid requirement"
    )


def test_the_wheel_is_the_backends(tmp_path):
    project = tmp_path / "project"
    (project / "src" / "tiny").mkdir(parents=True)
    (project / "src" / "tiny" / "__init__.py").write_text("ANSWER = 42\n")
    (project / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=77"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "tiny"\nversion = "1.2"\n[project.entry-points."sglang.srt.plugins"]\ntiny = "tiny:load"\n'
    )
    (tmp_path / "out").mkdir()
    name = build_wheel(
        str(project), str(tmp_path / "out"), build_system((project / "pyproject.toml").read_text()), sys.executable
    )
    assert name == "tiny-1.2-py3-none-any.whl"
    with zipfile.ZipFile(tmp_path / "out" / name) as wheel:
        assert wheel.read("tiny/__init__.py") == b"ANSWER = 42\n"
        assert b"[sglang.srt.plugins]" in wheel.read("tiny-1.2.dist-info/entry_points.txt")


def make_project(root, build_system_table):
    (root / "src" / "tiny").mkdir(parents=True)
    (root / "src" / "tiny" / "__init__.py").write_text("")
    (root / "pyproject.toml").write_text(build_system_table + '[project]\nname = "tiny"\nversion = "1.2"\n')
    return root


def test_overlay_build_refuses_a_backend_whose_requirements_are_not_installed(tmp_path, capsys):
    source = make_project(
        tmp_path / "src",
        '[build-system]\nrequires = ["setuptools>=77", "no-such-backend-ddtree>=1"]\n'
        'build-backend = "no_such_backend"\n',
    )
    code, result = run_module(overlay_build, {"source": str(source), "dest": str(tmp_path / "cache")}, capsys)
    assert code == 1
    assert "no-such-backend-ddtree>=1 (not installed)" in result["msg"]
    assert "requirements/ee-python.txt" in result["msg"]
    assert not (tmp_path / "cache").exists()


def test_overlay_build_names_a_failing_backend_and_its_output(tmp_path, capsys):
    source = make_project(
        tmp_path / "src", '[build-system]\nrequires = ["setuptools>=77"]\nbuild-backend = "setuptools.build_meta"\n'
    )
    (source / "pyproject.toml").write_text((source / "pyproject.toml").read_text() + "license = 7\n")
    code, result = run_module(overlay_build, {"source": str(source), "dest": str(tmp_path / "cache")}, capsys)
    assert code == 1
    assert result["msg"].startswith("building the wheel of %s with setuptools.build_meta failed" % source)
    assert "license" in result["msg"]
    assert not list((tmp_path / "cache").glob("*/*.whl"))


def test_overlay_build_builds_once_per_content(tmp_path, capsys):
    source = make_project(
        tmp_path / "src", '[build-system]\nrequires = ["setuptools>=77"]\nbuild-backend = "setuptools.build_meta"\n'
    )
    args = {"source": str(source), "dest": str(tmp_path / "cache")}
    code, first = run_module(overlay_build, args, capsys)
    assert code == 0 and first["changed"] and first["wheel"].endswith("/tiny-1.2-py3-none-any.whl")
    code, again = run_module(overlay_build, args, capsys)
    assert code == 0 and not again["changed"] and again["wheel"] == first["wheel"]
