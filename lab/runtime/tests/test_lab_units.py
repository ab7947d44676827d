"""The lab runtime's parts in-process: tokenizer, model exactness, lossless decoders, GPUs, faults."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ddtree_lab_runtime import decoding
from ddtree_lab_runtime.decoding import DecodePlan, Decoder, SamplingParams
from ddtree_lab_runtime.faults import LabConfigError, LabEnv, parse_faults
from ddtree_lab_runtime.gpus import environment_with_gpus, held_gpus
from ddtree_lab_runtime.model import LabDraftConfig, LabLM, LabModelConfig
from ddtree_lab_runtime.scheduler import SpecMetrics
from ddtree_lab_runtime.tokenizer import EOS_ID, IM_END_ID, ByteTokenizer, IncrementalDecoder

TOK = ByteTokenizer()
PROMPTS = [
    "The capital city of France is",
    "<|im_start|>user\nWhat does a careful engineer do?<|im_end|>\n<|im_start|>assistant\n",
    "Zürich, Ærø and 東京 — a río",
    "x",
]


@pytest.fixture(scope="module")
def target():
    return LabLM(LabModelConfig.from_path("/models/lab-target-8b"))


def greedy(decoder, prompt, n=80):
    out = []
    stats = decoder.generate(
        TOK.encode(prompt),
        SamplingParams(max_new_tokens=n, temperature=0.0),
        lambda chunk: out.extend(chunk) or True,
        stop_ids=TOK.stop_token_ids,
    )
    return out, stats


def test_tokenizer_bytes_specials_and_bang_at_id_0():
    assert TOK.decode([0]) == "!"
    for text in PROMPTS:
        assert TOK.decode(TOK.encode(text), skip_special_tokens=False) == text
    assert TOK.encode("<|im_end|>") == [IM_END_ID]
    assert TOK.decode(TOK.encode("a<|endoftext|>b")) == "ab"
    dec = IncrementalDecoder()
    ids = TOK.encode("é東")
    assert "".join(dec.feed([i]) for i in ids) + dec.flush() == "é東"


def test_model_is_deterministic_and_exact(target):
    again = LabLM(LabModelConfig.from_path("/models/lab-target-8b"))
    other = LabLM(LabModelConfig.from_path("/models/another"))
    ids = TOK.encode(PROMPTS[1])
    whole = target.context(ids)
    stepwise = target.context(ids[:3])
    for token in ids[3:]:
        stepwise = target.push(stepwise, token)
    a, b = target.logits(whole), target.logits(stepwise)
    assert a.tobytes() == b.tobytes()  # bit-identical however the context was built
    assert again.logits(again.context(ids)).tobytes() == a.tobytes()
    assert not np.array_equal(other.logits(other.context(ids)), a)


def test_model_from_json_config(tmp_path):
    (tmp_path / "config.json").write_text('{"lab_runtime": {"seed": 5, "ngram_order": 4, "context_length": 1024}}')
    cfg = LabModelConfig.from_path(str(tmp_path))
    assert (cfg.seed, cfg.ngram_order, cfg.context_length, cfg.source) == (5, 4, 1024, "config.json")
    (tmp_path / "config.json").write_text('{"dflash_config": {"block_size": 8}, "lab_runtime": {"noise": 0.5}}')
    draft = LabDraftConfig.from_path(str(tmp_path))
    assert (draft.block_size, draft.noise) == (8, 0.5)


def test_plain_greedy_text_is_not_degenerate_and_ends_a_turn(target):
    out, stats = greedy(Decoder(target, DecodePlan("none")), PROMPTS[0], n=200)
    text = TOK.decode(out)
    assert len(set(text)) > 15 and stats.finish_reason["type"] == "length"
    out, stats = greedy(Decoder(target, DecodePlan("none")), PROMPTS[1], n=3000)
    assert stats.finish_reason == {"type": "stop", "matched": IM_END_ID} and out[-1] == IM_END_ID
    assert EOS_ID not in out


PLANS = {
    "ddtree-15x8": DecodePlan("ddtree", draft_len=15, budget=15, top_k=8, num_draft_tokens=16, draft_path="/d"),
    "ddtree-4x2": DecodePlan("ddtree", draft_len=15, budget=4, top_k=2, num_draft_tokens=16, draft_path="/d"),
    "ddtree-1x1": DecodePlan("ddtree", draft_len=7, budget=1, top_k=1, num_draft_tokens=8, draft_path="/d"),
    "dflash-15": DecodePlan("dflash", draft_len=15, budget=15, top_k=1, num_draft_tokens=16, draft_path="/d"),
    "eagle-3": DecodePlan("eagle", draft_len=3, budget=3, top_k=1, num_draft_tokens=4, draft_path="/e"),
    "eagle-tree": DecodePlan("eagle", draft_len=4, budget=7, top_k=3, num_draft_tokens=8, draft_path="/e"),
}


@pytest.mark.parametrize("name", sorted(PLANS))
def test_speculative_greedy_is_lossless(target, name):
    plain = Decoder(target, DecodePlan("none"))
    spec = Decoder(target, PLANS[name])
    steps = 0
    for prompt in PROMPTS:
        ref, _ = greedy(plain, prompt)
        out, stats = greedy(spec, prompt)
        assert out == ref, (name, prompt)
        steps += stats.spec_verify_ct
        assert stats.spec_num_correct_drafts <= stats.spec_verify_ct * PLANS[name].budget
    assert steps < 4 * 79  # drafts were accepted


def test_decode_steps_are_the_decode_batches_sglang_counts(target):
    # Every step after the prefill's first token is one decode batch: a verify step (committed, accepted)
    # on a speculative server, a plain one-token step (None) otherwise.
    _out, stats = greedy(Decoder(target, PLANS["ddtree-15x8"]), PROMPTS[0])
    assert len(stats.decode_steps) == stats.spec_verify_ct and None not in stats.decode_steps
    assert sum(step[0] for step in stats.decode_steps) == stats.spec_num_accept_tokens == stats.completion_tokens - 1
    _out, stats = greedy(Decoder(target, DecodePlan("none")), PROMPTS[0])
    assert stats.decode_steps == [None] * (stats.completion_tokens - 1)


def test_the_server_average_counts_only_whole_decode_log_intervals():
    # SGLang 0.5.23 (metrics_reporter.report_decode_stats): a window of verify steps folds into the totals
    # /server_info reads only at every decode_log_interval-th decode batch.
    metrics = SpecMetrics(decode_log_interval=40)
    folded = [metrics.decode_batch((4, 3)) for _ in range(39)]
    assert folded == [None] * 39 and metrics.total.forward_ct == 0  # 39 batches: no average yet
    window = metrics.decode_batch((2, 1))
    assert (window.forward_ct, window.accept_tokens, window.correct_drafts) == (40, 158, 118)
    assert (metrics.total.forward_ct, metrics.total.accept_tokens) == (40, 158) and metrics.logged is window
    for _ in range(39):  # the next window is not in the average until its 40th batch
        assert metrics.decode_batch((1, 0)) is None
    assert (metrics.total.forward_ct, metrics.total.accept_tokens) == (40, 158)
    assert metrics.decode_batch(None).forward_ct == 39  # a plain decode batch counts, adds no verify step
    assert (metrics.total.forward_ct, metrics.total.accept_tokens, metrics.decode_batches) == (79, 197, 80)


def test_ddtree_tree_accepts_more_than_its_first_rank_chain(target):
    tree = Decoder(target, PLANS["ddtree-15x8"])
    chain = Decoder(
        target, DecodePlan("ddtree", draft_len=15, budget=15, top_k=1, num_draft_tokens=16, draft_path="/d")
    )
    steps_tree = sum(greedy(tree, p, 120)[1].spec_verify_ct for p in PROMPTS)
    steps_chain = sum(greedy(chain, p, 120)[1].spec_verify_ct for p in PROMPTS)
    assert steps_tree < steps_chain


def test_a_broken_verify_mask_is_caught(target, monkeypatch):
    """Control: with a causal (not ancestor-only) mask the verify rows are wrong."""
    monkeypatch.setattr(
        decoding._overlay_core(),
        "ancestor_mask",
        lambda tree: torch.tril(torch.ones(tree.batch_size, tree.num_slots, tree.num_slots, dtype=torch.bool)),
    )
    spec = Decoder(target, PLANS["ddtree-15x8"])
    with pytest.raises(RuntimeError, match="tree verify inputs disagree"):
        greedy(spec, PROMPTS[0])


@pytest.mark.parametrize("name", ["eagle-3", "dflash-15"])
def test_chain_without_the_overlay_decodes_as_the_core(target, monkeypatch, name):
    """A NEXTN/DFLASH service runs without the overlay (docs/services.md): the lab's own chain verify
    must give the very tokens and statistics the core's top-1 tree gives, greedy and sampled."""
    runs = {}
    for params in (
        SamplingParams(max_new_tokens=60, temperature=0),
        SamplingParams(max_new_tokens=60, temperature=0.8, top_p=0.95, seed=5),
    ):
        for core in ("core", "none"):
            if core == "none":
                monkeypatch.setattr(decoding, "_overlay_core", lambda: None)
            decoder = Decoder(target, PLANS[name])
            assert (decoder.core is None) == (core == "none")
            out = []
            stats = decoder.generate(TOK.encode(PROMPTS[0]), params, lambda c, out=out: out.extend(c) or True)
            runs[params.temperature, core] = (out, stats.spec_verify_ct, stats.spec_num_correct_drafts)
            monkeypatch.undo()
    assert runs[0, "none"] == runs[0, "core"]
    assert runs[0.8, "none"] == runs[0.8, "core"]
    assert runs[0, "core"][1] < 59  # drafts were accepted


def test_without_the_overlay_a_tree_is_refused(target, monkeypatch):
    monkeypatch.setattr(decoding, "_overlay_core", lambda: None)
    with pytest.raises(RuntimeError, match="only with the overlay's core importable"):
        Decoder(target, PLANS["eagle-tree"])


def test_sampling_is_seeded_and_spec_sampling_runs(target):
    params = SamplingParams(max_new_tokens=40, temperature=0.8, top_p=0.95, top_k=20, seed=3)
    for plan in (DecodePlan("none"), PLANS["ddtree-15x8"], PLANS["eagle-3"]):
        runs = []
        for _ in range(2):
            out = []
            Decoder(target, plan).generate(TOK.encode(PROMPTS[0]), params, lambda c, out=out: out.extend(c) or True)
            runs.append(out)
        assert runs[0] == runs[1] and len(runs[0]) == 40


def test_incident_and_degenerate_decoders(target):
    plan = DecodePlan(
        "no_hidden_capture",
        draft_len=15,
        budget=15,
        top_k=8,
        num_draft_tokens=16,
        draft_path="/d",
        hidden_capture=False,
    )
    out, _ = greedy(Decoder(target, plan), PROMPTS[1], n=30)
    assert TOK.decode(out) == "!" * 30
    out, _ = greedy(Decoder(target, PLANS["dflash-15"], degenerate_token=TOK.encode("#")[0]), PROMPTS[0], n=30)
    assert TOK.decode(out) == "#" * 30


def test_accept_collapse_keeps_ddtree_output_and_drops_its_acceptance_only(target):
    tree = PLANS["ddtree-15x8"]
    healthy_out, healthy = greedy(Decoder(target, tree), PROMPTS[0])
    collapsed_out, collapsed = greedy(Decoder(target, tree, accept_collapse=True), PROMPTS[0])
    assert collapsed_out == healthy_out  # lossless: only the drafts change
    healthy_len = healthy.spec_num_accept_tokens / healthy.spec_verify_ct
    collapsed_len = collapsed.spec_num_accept_tokens / collapsed.spec_verify_ct
    assert healthy_len > 2.0 and collapsed_len < 1.3, (healthy_len, collapsed_len)
    chain_out, chain = greedy(Decoder(target, PLANS["dflash-15"], accept_collapse=True), PROMPTS[0])
    _, chain_healthy = greedy(Decoder(target, PLANS["dflash-15"]), PROMPTS[0])
    assert chain.spec_num_accept_tokens == chain_healthy.spec_num_accept_tokens  # DFLASH unaffected


def test_gpu_holding_environment():
    argv = ["--model-path", "m", "--tp-size", "2"]
    assert held_gpus("4,5,6", argv) == ["4", "5"]
    assert held_gpus("4,5,6", ["--base-gpu-id", "1"]) == ["5"]
    assert held_gpus("0,1,2,3", ["--tp-size", "2", "--dp-size", "2"]) == ["0", "1", "2", "3"]
    env = environment_with_gpus({"CUDA_VISIBLE_DEVICES": "3,1", "PATH": "/bin"}, [])
    assert env == {"CUDA_VISIBLE_DEVICES": "3,1", "PATH": "/bin", "LAB_NVIDIA_GPUS": "3"}
    assert environment_with_gpus({"CUDA_VISIBLE_DEVICES": "1", "LAB_NVIDIA_GPUS": "1"}, []) is None
    assert environment_with_gpus({}, []) is None
    assert environment_with_gpus({"CUDA_VISIBLE_DEVICES": "GPU-abc"}, []) is None


def test_fault_switches_parse():
    f = parse_faults("slow:50, crash_after:3,degenerate:#")
    assert (f.slow_ms, f.crash_after, f.degenerate, f.hang, f.crash_at_start) == (50.0, 3, "#", False, None)
    assert parse_faults("hang").hang and parse_faults("").describe() == "none"
    assert parse_faults("accept_collapse").describe() == "accept_collapse"
    assert parse_faults("crash_at_start:CUDA out of memory").crash_at_start == "CUDA out of memory"
    for bad in ("crash_after:x", "slow:-1", "explode", "degenerate:ab"):
        with pytest.raises(LabConfigError, match="LAB_RUNTIME_FAULT"):
            parse_faults(bad)
    env = LabEnv.from_environ({"LAB_RUNTIME_LOAD_SECONDS": "0.5", "SGLANG_HEALTH_CHECK_TIMEOUT": "3"})
    assert (env.load_seconds, env.health_timeout, env.drain_seconds) == (0.5, 3.0, 15.0)
    with pytest.raises(LabConfigError, match="LAB_RUNTIME_LOAD_SECONDS"):
        LabEnv.from_environ({"LAB_RUNTIME_LOAD_SECONDS": "soon"})


def test_the_overlay_neither_imports_nor_carries_the_lab_runtime():
    import ast
    import pathlib

    import sglang_overlay

    root = pathlib.Path(sglang_overlay.__file__).parent
    assert not (root / "lab_runtime").exists() and not (root / "release_fault.py").exists()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.ImportFrom):
                names = [(node.module or "")] + [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            assert not any("lab_runtime" in n or "release_fault" in n for n in names), path


def test_bad_flag_switch_and_release_carried_fault(tmp_path, monkeypatch):
    from ddtree_lab_runtime import faults

    assert faults.parse_faults("bad_flag").bad_flag is True
    assert faults.parse_faults("bad_flag").describe() == "bad_flag"
    import sys
    import types

    assert faults.LabEnv.from_environ({}).faults.describe() == "none"
    carried = types.ModuleType(faults.RELEASE_FAULT_MODULE)
    carried.FAULT = "hang"
    monkeypatch.setitem(sys.modules, faults.RELEASE_FAULT_MODULE, carried)
    assert faults.LabEnv.from_environ({}).faults.hang is True
    # The environment wins over what the release carries.
    assert faults.LabEnv.from_environ({faults.ENV_FAULT: "slow:5"}).faults.describe() == "slow:5"
