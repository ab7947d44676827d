"""service_files: a service's state directory, environment, API key and unit, each written only when it differs,
and which of them changed (service_actions restarts the services that read them)."""

import os
import stat

import pytest
from conftest import run_module

from ansible_collections.ddtree.sglang.plugins.module_utils.service_files import (
    directory_differs,
    file_diff,
    file_differs,
    service_paths,
    wanted_files,
)
from ansible_collections.ddtree.sglang.plugins.modules import service_files

UNIT = "[Unit]\nDescription=SGLang coder\n"
ENVIRONMENT = '# Environment of sglang-coder.service\nHF_HOME="/var/cache/hf"\n'


def args(tmp_path, **extra):
    return dict(
        {
            "name": "coder",
            "unit": "sglang-coder.service",
            "unit_file": UNIT,
            "environment_file": ENVIRONMENT,
            "config_dir": str(tmp_path / "etc"),
            "state_root": str(tmp_path / "var" / "lib" / "sglang"),
            "systemd_dir": str(tmp_path / "systemd"),
            "owner": "root",
            "group": "root",
        },
        **extra,
    )


@pytest.fixture
def dirs(tmp_path):
    (tmp_path / "etc").mkdir()
    (tmp_path / "systemd").mkdir()
    return tmp_path


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_the_paths_are_the_services_own():
    assert service_paths("coder", "sglang-coder.service", "/etc/sglang", "/var/lib/sglang", "/etc/systemd/system") == {
        "state_dir": "/var/lib/sglang/coder",
        "environment": "/etc/sglang/coder.env",
        "api_key": "/etc/sglang/coder.api-key",
        "unit": "/etc/systemd/system/sglang-coder.service",
    }


def test_a_file_differs_by_content_mode_or_owner_and_an_absent_one_only_when_it_exists():
    wanted = wanted_files(service_paths("c", "u", "/e", "/s", "/d"), UNIT, ENVIRONMENT, None)
    environment, api_key, unit = wanted
    assert api_key["content"] is None and environment["mode"] == api_key["mode"] == 0o600 and unit["mode"] == 0o644
    same = {"content": UNIT, "mode": 0o644, "uid": 0, "gid": 0}
    assert not file_differs(unit, same)
    assert file_differs(unit, dict(same, content="old"))
    assert file_differs(unit, dict(same, mode=0o600))
    assert file_differs(unit, dict(same, uid=1000))
    assert file_differs(unit, None)
    assert not file_differs(api_key, None) and file_differs(
        api_key, {"content": "k\n", "mode": 0o600, "uid": 0, "gid": 0}
    )
    assert wanted_files(service_paths("c", "u", "/e", "/s", "/d"), UNIT, ENVIRONMENT, "k")[1]["content"] == "k\n"
    assert directory_differs(None, 0o750, 0, 0) and not directory_differs(
        {"mode": 0o750, "uid": 0, "gid": 0}, 0o750, 0, 0
    )


def test_a_first_run_writes_every_file_and_a_second_changes_nothing(dirs, capsys):
    code, result = run_module(service_files, args(dirs, api_key="s3cret", _ansible_diff=True), capsys)
    assert code == 0 and result["changed"] is True
    assert result["changes"] == ["state_dir", "environment", "api_key", "unit"]
    # The diff shows the environment and the unit, never the key.
    prepared = result["diff"]["prepared"]
    assert "+++ after: %s\n" % (dirs / "etc" / "coder.env") in prepared and '+HF_HOME="/var/cache/hf"\n' in prepared
    assert "+++ after: %s\n" % (dirs / "systemd" / "sglang-coder.service") in prepared and "+[Unit]\n" in prepared
    assert "s3cret" not in str(result)
    assert (dirs / "etc" / "coder.api-key").read_text() == "s3cret\n" and mode(dirs / "etc" / "coder.api-key") == 0o600
    assert (dirs / "etc" / "coder.env").read_text() == ENVIRONMENT and mode(dirs / "etc" / "coder.env") == 0o600
    assert (dirs / "systemd" / "sglang-coder.service").read_text() == UNIT
    assert mode(dirs / "systemd" / "sglang-coder.service") == 0o644
    # The state directory and its missing parents, each the account's with 0750 (as ansible.builtin.file makes them).
    assert mode(dirs / "var" / "lib" / "sglang" / "coder") == mode(dirs / "var") == 0o750
    code, result = run_module(service_files, args(dirs, api_key="s3cret"), capsys)
    assert code == 0 and result["changed"] is False and result["changes"] == []


def test_a_changed_environment_is_the_one_change_and_a_dropped_key_is_removed(dirs, capsys):
    run_module(service_files, args(dirs, api_key="s3cret"), capsys)
    code, result = run_module(service_files, args(dirs, environment_file=ENVIRONMENT + "X=1\n"), capsys)
    assert code == 0 and result["changes"] == ["environment", "api_key"]
    assert not (dirs / "etc" / "coder.api-key").exists()


def test_check_mode_says_what_would_change_and_writes_nothing(dirs, capsys):
    code, result = run_module(service_files, args(dirs, _ansible_check_mode=True), capsys)
    assert code == 0 and result["changed"] is True and result["changes"] == ["state_dir", "environment", "unit"]
    assert not (dirs / "systemd" / "sglang-coder.service").exists() and not (dirs / "var").exists()


def test_a_missing_account_fails_and_names_it(dirs, capsys):
    code, result = run_module(service_files, args(dirs, owner="no-such-account-here"), capsys)
    assert code == 1 and "coder: the services' account is missing" in result["msg"]


def test_a_diff_is_unified_and_says_a_file_without_a_last_newline():
    assert file_diff("/etc/sglang/coder.env", "A=1\n", "A=2\n") == (
        "--- before: /etc/sglang/coder.env\n+++ after: /etc/sglang/coder.env\n@@ -1 +1 @@\n-A=1\n+A=2\n"
    )
    assert file_diff("/x", None, "A=1").endswith("+A=1\n\\ No newline at end of file\n")
    assert file_diff("/x", "same\n", "same\n") == ""
