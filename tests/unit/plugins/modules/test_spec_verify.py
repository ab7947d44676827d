"""spec_verify driven through main(), with a stand-in stack (this interpreter) and release (a fake
predicates script and a fake SGLang parser in the release's site directory)."""

import json
import os
import sys
import textwrap

import pytest
from conftest import run_module

from ansible_collections.ddtree.sglang.plugins.modules import spec_verify

ROW = {"known": True, "kind": "builtin", "behaviour": {}}
PREDICATES = textwrap.dedent("""
    import importlib.util, json, sys
    # A release that leaks into the pristine run would show here as a changed built-in.
    release_importable = importlib.util.find_spec("sglang_overlay") is not None
    plugins = "--no-plugins" not in sys.argv
    algorithms = {
        "DFLASH": dict(ROW, resolves_to="DFLASH", predicates={"is_dflash": True, "is_dflash_family": True, "is_speculative": True}),
        "EAGLE": dict(ROW, resolves_to="EAGLE", predicates={"is_dflash": False, "is_dflash_family": False, "is_speculative": True,
                                                           "need_topk": not (release_importable and not plugins)}),
        "DDTREE": {"known": False},
    }
    if plugins and release_importable:
        algorithms["DDTREE"] = dict(ROW, kind="plugin", resolves_to="DDTREE", predicates=algorithms["DFLASH"]["predicates"])
    print("a log line before the JSON")
    print(json.dumps({"algorithms": algorithms}))
""").replace("ROW", json.dumps(ROW).replace("true", "True"))
FAKE_SGLANG = {
    "sglang/__init__.py": "",
    "sglang/srt/__init__.py": "",
    "sglang/srt/plugins.py": "def load_plugins():\n    pass\n",
    "sglang/srt/speculative/__init__.py": "",
    "sglang/srt/speculative/spec_info.py": textwrap.dedent("""
        import os
        class SpeculativeAlgorithm:
            def __init__(self, name):
                self.name = name
            def is_dflash_family(self):
                return self.name == "DDTREE"
            @classmethod
            def from_string(cls, name):
                # Known only in the service's environment: shows that the environment reaches the parse.
                if name != "DDTREE" or os.environ.get("FAKE_PLUGIN") != "loaded":
                    raise ValueError("Unknown speculative algorithm name: %s" % name)
                return cls(name)
    """),
    "sglang/srt/server_args.py": textwrap.dedent("""
        import argparse
        def prepare_server_args(argv):
            parser = argparse.ArgumentParser()
            parser.add_argument("--model-path", required=True)
            parser.add_argument("--port", type=int, default=30000)
            parser.add_argument("--speculative-algorithm")
            return parser.parse_args(argv)
    """),
}

# The release's hybrid layouts (the overlay's adapter.hybrid.layout_table, its answer's shape).
HYBRID = textwrap.dedent("""
    def layout_table():
        return [
            {"name": "GDN", "backend": "GDNAttnBackend", "config_classes": ["Qwen3_5Config"], "status": "tree",
             "reason": "parents' snapshots", "proven": "on the CPU reference only"},
            {"name": "Lightning", "backend": "LightningAttentionBackend", "config_classes": ["MiniCPMHybridConfig"],
             "status": "refused", "reason": "no parent-pointer path", "proven": "nothing: refused"},
        ]
""")


def stand_ins(tmp_path):
    os.makedirs(tmp_path / "stack" / "bin")
    os.symlink(sys.executable, tmp_path / "stack" / "bin" / "python")
    site = tmp_path / "release" / "site"
    files = dict(
        FAKE_SGLANG,
        **{
            "sglang_overlay/__init__.py": "",
            "sglang_overlay/predicates.py": PREDICATES,
            "sglang_overlay/adapter/__init__.py": "",
            "sglang_overlay/adapter/hybrid.py": HYBRID,
        },
    )
    for name, text in files.items():
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text(text)
    return {"stack": str(tmp_path / "stack"), "release": str(tmp_path / "release")}


FLAGS = ["--model-path", "/models/coder", "--speculative-algorithm", "DDTREE"]


def test_a_good_release_passes_and_its_flags_resolve(tmp_path, capsys):
    args = dict(stand_ins(tmp_path), flags=FLAGS, environment={"FAKE_PLUGIN": "loaded"})
    code, result = run_module(spec_verify, args, capsys)
    assert code == 0, result.get("msg")
    assert result["builtin_differences"] == [] and result["plugin_problems"] == []
    assert [line.split()[-1] for line in result["matrix"][1:]] == ["plugin", "same", "same"]
    assert result["parsed"] == {
        "model_path": "/models/coder",
        "port": 30000,
        "algorithm": "DDTREE",
        "resolves_to": "DDTREE",
        "is_dflash_family": True,
        "plugins": [],
    }


def test_the_release_says_which_hybrid_layouts_get_a_tree_and_what_is_proven(tmp_path, capsys):
    code, result = run_module(spec_verify, stand_ins(tmp_path), capsys)
    assert code == 0, result.get("msg")
    assert result["hybrid_layouts"] == [
        "GDN (GDNAttnBackend): tree verify; proven on the CPU reference only",
        "Lightning (LightningAttentionBackend): refused: no parent-pointer path",
    ]


def test_a_release_without_the_layout_table_says_so_and_still_passes(tmp_path, capsys):
    paths = stand_ins(tmp_path)
    (tmp_path / "release" / "site" / "sglang_overlay" / "adapter" / "hybrid.py").unlink()
    code, result = run_module(spec_verify, paths, capsys)
    assert code == 0, result.get("msg")
    assert result["hybrid_layouts"] == [
        "the release does not list its hybrid layouts "
        "(ModuleNotFoundError: No module named 'sglang_overlay.adapter.hybrid')"
    ]


def test_the_service_environment_reaches_only_the_parse(tmp_path, capsys):
    code, result = run_module(spec_verify, dict(stand_ins(tmp_path), flags=FLAGS), capsys)
    assert code == 1
    assert result["msg"] == (
        "--speculative-algorithm DDTREE does not resolve with the release: "
        "ValueError: Unknown speculative algorithm name: DDTREE"
    )


def test_a_bad_flag_is_named(tmp_path, capsys):
    code, result = run_module(spec_verify, dict(stand_ins(tmp_path), flags=FLAGS + ["--nope"]), capsys)
    assert code == 1
    assert result["msg"].startswith("SGLang's parser on the service's flags failed (exit 2): ")
    assert "unrecognized arguments: --nope" in result["msg"]


def test_a_release_that_changes_a_builtin_fails(tmp_path, capsys):
    paths = stand_ins(tmp_path)
    script = tmp_path / "release" / "site" / "sglang_overlay" / "predicates.py"
    script.write_text(
        script.read_text().replace('"need_topk": not (release_importable and not plugins)', '"need_topk": not plugins')
    )
    code, result = run_module(spec_verify, paths, capsys)
    assert code == 1
    assert result["msg"] == (
        "the release changes SGLang's speculative algorithms: "
        "EAGLE.need_topk: True in pristine SGLang, False with the release"
    )


def test_a_crashing_check_is_reported_with_its_last_line(tmp_path, capsys):
    paths = stand_ins(tmp_path)
    (tmp_path / "release" / "site" / "sglang_overlay" / "predicates.py").write_text("import no_such_sglang_module\n")
    code, result = run_module(spec_verify, paths, capsys)
    assert code == 1
    assert result["msg"] == (
        "the pristine predicate matrix failed (exit 1): ModuleNotFoundError: No module named 'no_such_sglang_module'"
    )


def recordable(tmp_path):
    """The stand-ins made complete (a stack's marker, a release's manifest), with a state root to record in."""
    paths = stand_ins(tmp_path)
    (tmp_path / "stack" / ".ddtree-stack-complete").write_text("{}\n")
    (tmp_path / "release" / "manifest.json").write_text("{}\n")
    return dict(paths, flags=FLAGS, environment={"FAKE_PLUGIN": "loaded"}, state_root=str(tmp_path / "state"))


def records(tmp_path):
    directory = tmp_path / "state" / "_checks" / "spec_verify"
    return sorted(os.listdir(directory)) if directory.is_dir() else []


def test_a_pass_is_recorded_and_not_checked_again(tmp_path, monkeypatch, capsys):
    args = recordable(tmp_path)
    code, first = run_module(spec_verify, args, capsys)
    assert code == 0 and first["recorded"] is False and records(tmp_path) == [os.path.basename(first["record"])]

    def no_process(*args, **kwargs):
        raise AssertionError("the stack's Python was started")

    monkeypatch.setattr(spec_verify.AnsibleModule, "run_command", no_process)
    code, second = run_module(spec_verify, args, capsys)
    assert code == 0 and second["recorded"] is True and second["changed"] is False, second.get("msg")
    assert second["matrix"] == first["matrix"] and second["parsed"] == first["parsed"]
    assert "not checked again" in second["msg"]
    # Other flags are another key: checked, so the stack's Python is started.
    with pytest.raises(AssertionError, match="the stack's Python was started"):
        run_module(spec_verify, dict(args, flags=FLAGS + ["--port", "30001"]), capsys)


def test_a_tampered_release_is_checked_again(tmp_path, capsys):
    args = recordable(tmp_path)
    assert run_module(spec_verify, args, capsys)[0] == 0
    with open(tmp_path / "release" / "site" / "sglang_overlay" / "predicates.py", "a") as handle:
        handle.write("raise SystemExit('tampered')\n")
    code, result = run_module(spec_verify, args, capsys)
    assert code == 1 and result["msg"] == "the pristine predicate matrix failed (exit 1): tampered"


def test_a_failed_check_check_mode_and_an_incomplete_release_record_nothing(tmp_path, capsys):
    args = recordable(tmp_path)
    assert run_module(spec_verify, dict(args, environment={}), capsys)[0] == 1
    assert records(tmp_path) == []
    code, result = run_module(spec_verify, dict(args, _ansible_check_mode=True), capsys)
    assert code == 0 and result["recorded"] is False and records(tmp_path) == []
    os.unlink(tmp_path / "release" / "manifest.json")
    code, result = run_module(spec_verify, args, capsys)
    assert code == 0 and "record" not in result and records(tmp_path) == []
