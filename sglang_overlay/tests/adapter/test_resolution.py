"""DDTREE through SGLang's resolution: DFLASH's own setup (``_handle_dflash``) runs for it.

The steps run through SGLang's ``run_hook`` with the plugin's registered wrappers. Two stand-ins,
because the real code imports torchvision (no CPU build installable beside torch 2.13 CPU):
the first pipeline step (``parallel_hook.handle_deprecated_dp_attention``) is replaced by a no-op
of the same name, and ``_resolve_speculative_algorithm_alias`` (which reads the draft's HF config
only to spot Gemma-4 drafts) by the identity. Everything else is SGLang's code.
"""

from __future__ import annotations

import json
import logging
import pickle
import sys
import types

import pytest

from sglang_overlay import knobs
from sglang_overlay.adapter import settings as s

from ._helpers import plugin_in_process, requires_sglang  # noqa: F401 - fixture

pytestmark = [requires_sglang, pytest.mark.usefixtures("plugin_in_process")]

FIELDS = (
    "speculative_algorithm",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "max_running_requests",
    "speculative_draft_attention_backend",
    "speculative_draft_model_revision",
)


def handle_deprecated_dp_attention(server_args):  # stand-in: same name, so run_hook wraps it
    return None


@pytest.fixture(autouse=True)
def keep_root_logging():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture
def env(monkeypatch):
    from sglang.srt.arg_groups import speculative_hook

    for name in (s.ENV_BUDGET, s.ENV_TOP_K, s.ENV_ALLOW_HYBRID):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(speculative_hook, "_resolve_speculative_algorithm_alias", lambda algo, *a, **k: algo)
    return monkeypatch


@pytest.fixture
def draft_dir(tmp_path):
    d = tmp_path / "draft"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["DFlashDraftModel"], "model_type": "qwen3"}))
    return str(d)


def resolve(argv, first_step=True):
    from sglang.srt.arg_groups.resolution_hooks import run_hook
    from sglang.srt.arg_groups.speculative_hook import handle_speculative_decoding
    from sglang.srt.server_args import prepare_server_args

    args = prepare_server_args(argv)
    if first_step:
        run_hook(handle_deprecated_dp_attention, args)
    run_hook(handle_speculative_decoding, args)
    return args


def resolved(args) -> dict:
    from sglang.srt.arg_groups.overrides import resolution_result

    return {f: resolution_result(args, f) for f in FIELDS}


def base(draft_dir, algo="DDTREE", *extra):
    return [
        "--model-path",
        "some/model",
        "--device",
        "cuda",
        "--speculative-algorithm",
        algo,
        "--speculative-draft-model-path",
        draft_dir,
        "--speculative-dflash-block-size",
        "16",
        *extra,
    ]


def test_ddtree_runs_dflash_setup(env, draft_dir):
    args = resolve(base(draft_dir))
    assert resolved(args) == {
        "speculative_algorithm": "DFLASH",
        "speculative_num_steps": 1,
        "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": 16,
        "max_running_requests": 48,
        "speculative_draft_attention_backend": "flashinfer",
        "speculative_draft_model_revision": "main",
    }
    sources = [src for src, _ in args._resolved_overrides]
    assert sources[0] == "ddtree" and "_handle_dflash" in sources
    assert args.speculative_algorithm == "DDTREE"  # the operator's raw input is kept
    assert args._ddtree == {
        "budget": 15,
        "top_k": 8,
        "allow_hybrid_unsafe": False,
        "window": 16,
        "draft_block": 16,
        "schedule": (),
    }


def test_ddtree_resolution_equals_dflash_plus_the_ddtree_declaration(env, draft_dir):
    ddtree = resolve(base(draft_dir, "DDTREE"))
    dflash = resolve(base(draft_dir, "DFLASH"))
    assert ddtree._resolved_overrides[0] == ("ddtree", {"speculative_algorithm": "DFLASH"})
    assert ddtree._resolved_overrides[1:] == dflash._resolved_overrides
    assert getattr(dflash, "_ddtree", None) is None  # a DFLASH server stays a DFLASH server


def test_speculative_step_alone_still_canonicalizes(env, draft_dir):
    args = resolve(base(draft_dir), first_step=False)
    assert resolved(args)["speculative_algorithm"] == "DFLASH" and args._ddtree["budget"] == 15


def test_flags_and_env_reach_the_resolved_settings(env, draft_dir):
    env.setenv(s.ENV_TOP_K, "3")
    args = resolve(base(draft_dir, "DDTREE", "--speculative-ddtree-budget", "6"))
    assert args._ddtree == {
        "budget": 6,
        "top_k": 3,
        "allow_hybrid_unsafe": False,
        "window": 16,
        "draft_block": 16,
        "schedule": (),
    }


def test_window_follows_the_dflash_block_size(env, draft_dir):
    argv = [
        "--model-path",
        "m",
        "--device",
        "cuda",
        "--speculative-algorithm",
        "DDTREE",
        "--speculative-draft-model-path",
        draft_dir,
        "--speculative-num-draft-tokens",
        "8",
    ]
    args = resolve(argv)
    assert resolved(args)["speculative_num_draft_tokens"] == 8
    assert args._ddtree["budget"] == 7 and args._ddtree["window"] == 8


def test_budget_beyond_the_block_widens_sglangs_verify_window(env, draft_dir):
    args = resolve(base(draft_dir, "DDTREE", "--speculative-ddtree-budget", "63"))
    # SGLang reserves KV and captures the target's verify graphs for 64 tokens a request ...
    assert resolved(args)["speculative_num_draft_tokens"] == 64
    assert args._resolved_overrides[-1] == ("ddtree", {"speculative_num_draft_tokens": 64})
    # ... and the drafter keeps its block of 16.
    assert (args._ddtree["window"], args._ddtree["draft_block"], args._ddtree["budget"]) == (64, 16, 63)


def test_a_schedule_resolves_to_its_widest_window(env, draft_dir):
    args = resolve(base(draft_dir, "DDTREE", "--speculative-ddtree-budget", "1:31,16:15,48:7"))
    assert resolved(args)["speculative_num_draft_tokens"] == 32
    assert args._ddtree["schedule"] == ((1, 31), (16, 15), (48, 7))
    got = s.ResolvedDDTree.from_dict(args._ddtree)
    assert [got.for_batch(bs).window for bs in (1, 2, 16, 17)] == [32, 16, 16, 8]


def test_bad_budget_flag_exits_2_naming_it(env, draft_dir, capsys):
    with pytest.raises(SystemExit) as err:
        resolve(base(draft_dir, "DDTREE", "--speculative-ddtree-budget", "1:15,1:7"))
    assert err.value.code == 2
    assert "--speculative-ddtree-budget" in capsys.readouterr().err


def test_dflash_checks_apply_to_ddtree(env, draft_dir):
    # SGLang's own _handle_dflash errors, reached through DDTREE.
    with pytest.raises(ValueError, match="requires setting --speculative-draft-model-path"):
        resolve(["--model-path", "m", "--device", "cuda", "--speculative-algorithm", "DDTREE"])
    with pytest.raises(ValueError, match="must match"):
        resolve(base(draft_dir, "DDTREE", "--speculative-num-draft-tokens", "8"))


@pytest.mark.parametrize(
    "extra, needle",
    [
        (("--speculative-draft-window-size", "64"), "--speculative-draft-window-size"),
        (("--speculative-use-rejection-sampling",), "--speculative-use-rejection-sampling"),
    ],
)
def test_unsupported_options_are_refused_by_name(env, draft_dir, extra, needle):
    with pytest.raises(s.DDTreeConfigError) as err:
        resolve(base(draft_dir, "DDTREE", *extra))
    assert needle in str(err.value)


def test_hybrid_target_refused_unless_allowed(env, draft_dir, tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"model_type": "qwen3_next"}))
    argv = base(draft_dir)
    argv[1] = str(target)
    with pytest.raises(s.DDTreeConfigError, match="--speculative-ddtree-allow-hybrid-unsafe"):
        resolve(argv)
    args = resolve(argv + ["--speculative-ddtree-allow-hybrid-unsafe"])
    assert args._ddtree["allow_hybrid_unsafe"] is True
    env.setenv(s.ENV_ALLOW_HYBRID, "1")
    assert resolve(argv)._ddtree["allow_hybrid_unsafe"] is True


def test_settings_travel_to_child_processes_with_the_record(env, draft_dir):
    # SGLang pickles ServerArgs (with its bookkeeping) into the scheduler processes.
    args = resolve(base(draft_dir))
    copy = pickle.loads(pickle.dumps(args))
    assert copy._ddtree == args._ddtree
    assert resolved(copy)["speculative_algorithm"] == "DFLASH"

    from sglang_overlay.adapter.resolution import resolved_settings

    assert resolved_settings(copy) == s.ResolvedDDTree(15, 8, False, 16, 16)


# ---- the worker selection hook and the algorithm object ------------------------------------


@pytest.fixture
def fake_worker_module(monkeypatch):
    """worker.py imports SGLang's GPU stack; a stand-in module carries the class identity."""
    module = types.ModuleType("sglang_overlay.adapter.worker")

    class DDTreeWorker:  # noqa: D401 - a marker class
        pass

    module.DDTreeWorker = DDTreeWorker
    monkeypatch.setitem(sys.modules, "sglang_overlay.adapter.worker", module)
    return DDTreeWorker


def test_create_worker_hook_picks_the_ddtree_worker_only_for_ddtree_records(env, draft_dir, fake_worker_module):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from sglang_overlay.adapter.algorithm import around_create_worker

    calls = []

    def original(self, server_args):
        calls.append(self)
        return "sglang's own worker"

    ddtree_args = resolve(base(draft_dir, "DDTREE"))
    dflash_args = resolve(base(draft_dir, "DFLASH"))
    assert around_create_worker(original, SpeculativeAlgorithm.DFLASH, ddtree_args) is fake_worker_module
    assert around_create_worker(original, SpeculativeAlgorithm.DFLASH, dflash_args) == "sglang's own worker"
    assert around_create_worker(original, SpeculativeAlgorithm.EAGLE, ddtree_args) == "sglang's own worker"
    assert calls == [SpeculativeAlgorithm.DFLASH, SpeculativeAlgorithm.EAGLE]


def test_the_hook_is_installed_on_sglangs_method(env):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from sglang_overlay.adapter.algorithm import around_create_worker

    method = SpeculativeAlgorithm.create_worker
    assert getattr(method, "__wrapped__", None) is not None  # HookRegistry's wrapper
    assert any(cell.cell_contents is around_create_worker for cell in method.__closure__)


def test_ddtree_algorithm_object(env, fake_worker_module):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    algo = SpeculativeAlgorithm.from_string("ddtree")
    assert algo.name == "DDTREE" and algo.supports_overlap is True
    for method in (
        "carries_draft_hidden_states",
        "need_topk",
        "has_draft_kv",
        "create_future_map",
        "build_disagg_draft_input",
        "get_platform_worker_cls",
    ):
        assert callable(getattr(algo, method)), method
    assert algo.carries_draft_hidden_states() is SpeculativeAlgorithm.DFLASH.carries_draft_hidden_states()
    assert algo.need_topk() is False
    assert algo.get_num_tokens_per_req_for_target_verify(16, True) == 16
    with pytest.raises(RuntimeError, match="canonicalize_ddtree"):
        algo.handle_server_args(object())


def test_ddtree_create_worker_returns_the_ddtree_worker(env, draft_dir, fake_worker_module):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    args = resolve(base(draft_dir))
    assert SpeculativeAlgorithm.from_string("DDTREE").create_worker(args) is fake_worker_module
    # and DFLASH's own create_worker, through the installed hook, for the same record:
    assert SpeculativeAlgorithm.DFLASH.create_worker(args) is fake_worker_module


def test_graph_guard_refuses_tree_verify_batches_without_a_tree_mask_graph():
    from sglang_overlay.adapter.hooks import TREE_MASK_CAPTURED, TREE_VERIFY_MARKER, around_can_run_graph

    def original(self, forward_batch):
        return "graph decision"

    tree_batch = types.SimpleNamespace(spec_info=types.SimpleNamespace(**{TREE_VERIFY_MARKER: True}))
    chain_batch = types.SimpleNamespace(spec_info=types.SimpleNamespace())
    plain_batch = types.SimpleNamespace(spec_info=None)
    causal_runner = types.SimpleNamespace()  # captured with DFLASH's mask-less input
    masked_runner = types.SimpleNamespace(**{TREE_MASK_CAPTURED: True})
    assert around_can_run_graph(original, causal_runner, tree_batch) is False
    assert around_can_run_graph(original, masked_runner, tree_batch) == "graph decision"
    assert around_can_run_graph(original, causal_runner, chain_batch) == "graph decision"
    assert around_can_run_graph(original, causal_runner, plain_batch) == "graph decision"


def _graph_runner(draft_dir, algo="DDTREE", is_draft_worker=False):
    args = resolve(base(draft_dir, algo))
    model_runner = types.SimpleNamespace(is_draft_worker=is_draft_worker, server_args=args)
    return types.SimpleNamespace(model_runner=model_runner, buffers=types.SimpleNamespace(custom_mask="BUF"))


def test_ddtree_target_graphs_are_captured_with_the_tree_mask(env, draft_dir, monkeypatch):
    from sglang_overlay.adapter import hooks

    monkeypatch.delenv(knobs.EAGER_TREE_VERIFY.name, raising=False)
    runner = _graph_runner(draft_dir)
    dummy = hooks.after_get_spec_info(types.SimpleNamespace(custom_mask=None), runner, 64)
    assert dummy.custom_mask == "BUF" and getattr(runner, hooks.TREE_MASK_CAPTURED) is True


@pytest.mark.parametrize("case", ["DFLASH server", "draft runner", "eager env", "no custom_mask field"])
def test_other_graph_captures_are_unchanged(env, draft_dir, monkeypatch, case):
    from sglang_overlay.adapter import hooks

    monkeypatch.delenv(knobs.EAGER_TREE_VERIFY.name, raising=False)
    algo = "DFLASH" if case == "DFLASH server" else "DDTREE"
    runner = _graph_runner(draft_dir, algo, is_draft_worker=(case == "draft runner"))
    if case == "eager env":
        monkeypatch.setenv(knobs.EAGER_TREE_VERIFY.name, "1")
    dummy = types.SimpleNamespace() if case == "no custom_mask field" else types.SimpleNamespace(custom_mask=None)
    out = hooks.after_get_spec_info(dummy, runner, 64)
    assert getattr(out, "custom_mask", None) is None
    assert not getattr(runner, hooks.TREE_MASK_CAPTURED, False)
