"""The predicate matrix: built-ins identical with and without the plugin; DDTREE == DFLASH."""

from __future__ import annotations

import inspect
import json

import pytest

from ._helpers import SRC, requires_sglang, run_probe

pytestmark = [requires_sglang, pytest.mark.slow]


# Every program here runs in an interpreter of its own that starts with no SGLang imported:
# run_probe, a child forked off a server that has imported only torch and other third-party
# modules, with the sys.path and environment of a fresh interpreter (_helpers.py). What the two
# CLI tests prove holds there as in a fresh `python -c`: the file run by path and the module run as
# __main__ both go through runpy in the child, and nothing of the overlay or SGLang is imported
# before (so "runs on its own" is no weaker; the deploy tooling runs this file forked the same way,
# plugins/module_utils/forked_jobs.py).


def _matrix(*args: str, env=None) -> tuple[dict, int, str]:
    proc = run_probe(
        "import sys; from sglang_overlay.predicates import main; sys.exit(main(sys.argv[1:]))",
        args=("--json", *args),
        env=env,
    )
    return json.loads(proc.stdout), proc.returncode, proc.stderr


@pytest.fixture(scope="module")
def pristine():
    matrix, rc, err = _matrix("--no-plugins")
    assert rc == 0, err
    return matrix


@pytest.fixture(scope="module")
def with_plugin():
    matrix, rc, err = _matrix("--check-ddtree")
    assert rc == 0, err
    return matrix


def test_predicates_are_found_by_introspection(pristine):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    expected = sorted(
        name
        for name, value in vars(SpeculativeAlgorithm).items()
        if inspect.isfunction(value)
        and name.startswith(("is_", "supports_", "has_", "carries_", "need_"))
        and len(inspect.signature(value).parameters) == 1
    )
    assert pristine["predicates"] == expected
    for name in ("is_dflash", "is_dflash_family", "carries_draft_hidden_states", "need_topk", "has_draft_kv"):
        assert name in expected


def test_every_builtin_and_alias_is_reported(pristine):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    names = set(pristine["algorithms"])
    assert {m.name for m in SpeculativeAlgorithm} | {"NEXTN", "DDTREE"} <= names
    assert pristine["algorithms"]["NEXTN"]["resolves_to"] == "EAGLE"


def test_builtin_rows_are_identical_with_the_plugin(pristine, with_plugin):
    assert pristine["plugins_loaded"] is False and with_plugin["plugins_loaded"] is True
    assert "ddtree" in with_plugin["plugins_discovered"]
    builtins = [n for n, row in pristine["algorithms"].items() if row.get("known")]
    assert len(builtins) >= 10  # 9 enum members + NEXTN
    for name in builtins:
        assert with_plugin["algorithms"][name] == pristine["algorithms"][name], name


def test_ddtree_unknown_without_plugin(pristine):
    row = pristine["algorithms"]["DDTREE"]
    assert row["known"] is False and "Unknown speculative algorithm name" in row["error"]


def test_ddtree_answers_every_predicate_as_dflash(with_plugin):
    ddtree = with_plugin["algorithms"]["DDTREE"]
    dflash = with_plugin["algorithms"]["DFLASH"]
    assert ddtree["kind"] == "plugin" and ddtree["resolves_to"] == "DDTREE"
    assert ddtree["predicates"] == dflash["predicates"]
    assert ddtree["predicates"]["is_dflash"] is True
    assert ddtree["predicates"]["is_dflash_family"] is True
    assert ddtree["predicates"]["is_eagle"] is False
    for key, value in dflash["behaviour"].items():
        if key != "plugin_supports_overlap":
            assert ddtree["behaviour"][key] == value, key
    assert ddtree["behaviour"]["plugin_supports_overlap"] is True


def test_check_ddtree_fails_without_the_plugin():
    matrix, rc, err = _matrix("--no-plugins", "--check-ddtree")
    assert rc == 1 and "DDTREE is not a known speculative algorithm" in err


def test_ddtree_problem_spots_a_wrong_predicate(with_plugin):
    from sglang_overlay.predicates import ddtree_problem

    assert ddtree_problem(with_plugin) is None
    broken = json.loads(json.dumps(with_plugin))
    broken["algorithms"]["DDTREE"]["predicates"]["is_dflash_family"] = False
    assert "is_dflash_family" in ddtree_problem(broken)
    broken = json.loads(json.dumps(with_plugin))
    broken["algorithms"]["DDTREE"]["predicates"]["need_topk"] = True
    assert "differs from DFLASH" in ddtree_problem(broken)


def test_the_file_runs_on_its_own():
    # The deploy tooling may run a copy of the file, outside the package.
    proc = run_probe(
        "import runpy, sys; sys.argv = ['predicates.py', '--json', '--no-plugins'];"
        f"runpy.run_path({str(SRC / 'sglang_overlay' / 'predicates.py')!r}, run_name='__main__')"
    )
    assert proc.returncode == 0, proc.stderr
    assert "DFLASH" in json.loads(proc.stdout)["algorithms"]


def test_module_cli_is_python_dash_m():
    proc = run_probe(
        "import runpy; runpy.run_module('sglang_overlay.predicates', run_name='__main__')",
        args=("--json", "--check-ddtree"),
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["algorithms"]["DDTREE"]["known"] is True
