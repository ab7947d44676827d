"""The DDTree flags through SGLang's own parser (``prepare_server_args``), plugin loaded."""

from __future__ import annotations

import logging

import pytest

from sglang_overlay.adapter import settings as s

from ._helpers import plugin_in_process, requires_sglang  # noqa: F401 - fixture

pytestmark = [requires_sglang, pytest.mark.usefixtures("plugin_in_process")]

BASE = ["--model-path", "some/model"]


@pytest.fixture(autouse=True)
def keep_root_logging():
    # prepare_server_args() calls logging.basicConfig(force=True); give pytest its handlers back.
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture
def clean_env(monkeypatch):
    for name in (s.ENV_BUDGET, s.ENV_TOP_K, s.ENV_ALLOW_HYBRID):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def parse(argv):
    from sglang.srt.server_args import prepare_server_args

    return prepare_server_args(BASE + argv)


def test_good_values_parse(clean_env):
    args = parse(
        [
            "--speculative-algorithm",
            "DDTREE",
            "--speculative-ddtree-budget",
            "7",
            "--speculative-ddtree-top-k",
            "3",
            "--speculative-ddtree-allow-hybrid-unsafe",
        ]
    )
    assert args.speculative_algorithm == "DDTREE"
    assert args._ddtree_cli == {
        s.DEST_BUDGET: 7,
        s.DEST_TOP_K: 3,
        s.DEST_ALLOW_HYBRID: True,
    }


def test_flags_absent_are_none(clean_env):
    args = parse(["--speculative-algorithm", "DDTREE"])
    assert args._ddtree_cli == {s.DEST_BUDGET: None, s.DEST_TOP_K: None, s.DEST_ALLOW_HYBRID: None}


@pytest.mark.parametrize(
    "flag, value",
    [
        ("--speculative-ddtree-budget", "0"),
        ("--speculative-ddtree-budget", "-1"),
        ("--speculative-ddtree-budget", "x"),
        ("--speculative-ddtree-top-k", "0"),
        ("--speculative-ddtree-top-k", "2.5"),
    ],
)
def test_bad_flag_values_exit_2_naming_the_flag(clean_env, capsys, flag, value):
    with pytest.raises(SystemExit) as exit_info:
        parse(["--speculative-algorithm", "DDTREE", flag, value])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}" in err and repr(value) in err


@pytest.mark.parametrize(
    "name, value",
    [(s.ENV_BUDGET, "0"), (s.ENV_BUDGET, "lots"), (s.ENV_TOP_K, "-2"), (s.ENV_ALLOW_HYBRID, "perhaps")],
)
def test_bad_env_fails_the_parse_naming_the_variable(clean_env, name, value):
    clean_env.setenv(name, value)
    with pytest.raises(s.DDTreeConfigError) as err:
        parse(["--speculative-algorithm", "DDTREE"])
    assert name in str(err.value) and repr(value) in str(err.value)


def test_bad_env_is_ignored_for_other_algorithms(clean_env):
    clean_env.setenv(s.ENV_BUDGET, "lots")
    args = parse(["--speculative-algorithm", "NEXTN"])
    assert args.speculative_algorithm == "NEXTN"


def test_flag_beats_a_bad_env_value(clean_env):
    clean_env.setenv(s.ENV_BUDGET, "lots")
    args = parse(["--speculative-algorithm", "ddtree", "--speculative-ddtree-budget", "5"])
    assert args._ddtree_cli[s.DEST_BUDGET] == 5


def test_unknown_flags_still_exit_2(clean_env, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse(["--speculative-algorithm", "DDTREE", "--speculative-ddtree-bogus", "1"])
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --speculative-ddtree-bogus" in capsys.readouterr().err


def test_other_flags_are_unchanged(clean_env):
    args = parse(
        [
            "--speculative-algorithm",
            "EAGLE",
            "--speculative-num-steps",
            "3",
            "--speculative-eagle-topk",
            "1",
            "--speculative-num-draft-tokens",
            "4",
        ]
    )
    assert (args.speculative_num_steps, args.speculative_eagle_topk, args.speculative_num_draft_tokens) == (3, 1, 4)


def test_flags_appear_in_help(clean_env, capsys):
    with pytest.raises(SystemExit):
        parse(["--help"])
    out = capsys.readouterr().out
    for flag in (s.FLAG_BUDGET, s.FLAG_TOP_K, s.FLAG_ALLOW_HYBRID):
        assert flag in out
