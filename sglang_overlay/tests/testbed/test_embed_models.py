"""The embedded GPU test bed is exact: tests/gpu_sglang/embed_models.py puts the trained tiny Qwen3 pair
(docs/evidence/gpu-sglang/models.tgz) into small "big" shapes by the same code the device runs for the
production shapes, and the big models compute the tiny ones' logits.

Target: Hugging Face's Qwen3ForCausalLM / Qwen3MoeForCausalLM in float32, tiny vs embedded, logits over the
real vocabulary equal, the softmax over the whole big vocabulary equal to the tiny one, and no unused id ever
near the top. Drafter: the harness's own DFlash forward (train_models.Drafter, the mirror of SGLang's;
embed_models.draft_logits), tiny vs embedded on each target's own features.

Shapes: dense hidden 1024 (one copy of the stream, as in Qwen3-8B's 4096) and MoE hidden 2048 (two copies, as
in Qwen3-Coder-30B-A3B's 2048), head_dim 128, GQA groups wider than the tiny one's, extra identity layers and
drafter layers.

DFlash2 drafter (DFlash2DraftModel: grouped convolutions and a candidate selector): on the trained drafter's
backbone, with large random taps and selector tables; embedded, it computes the tiny one's logits and the tiny
one's lattice (candidates, transition scores, greedy path) over each target's own lm_head.
"""

import functools
import importlib.util
import json
import math
import random
import shutil
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")

HARNESS = Path(__file__).resolve().parents[3] / "tests" / "gpu_sglang"
TINY_VOCAB = 512


def load_harness(name: str):
    """A harness module by path (tests/gpu_sglang is no package), with its siblings importable."""
    if str(HARNESS) not in sys.path:
        sys.path.insert(0, str(HARNESS))
    spec = importlib.util.spec_from_file_location(name, HARNESS / (name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


embed_models = load_harness("embed_models")
train_models = load_harness("train_models")
synth_lang = load_harness("synth_lang")


def shape_configs(moe: bool) -> tuple:
    """(target config, drafter config) of a small production-like shape."""
    common = dict(
        vocab_size=1024,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=128,
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        hidden_act="silu",
        attention_bias=False,
        attention_dropout=0.0,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
        torch_dtype="bfloat16",
    )
    if moe:
        target = dict(
            common,
            architectures=["Qwen3MoeForCausalLM"],
            model_type="qwen3_moe",
            hidden_size=2048,
            num_hidden_layers=5,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=1024,
            moe_intermediate_size=768,
            num_experts=4,
            num_experts_per_tok=2,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            output_router_logits=False,
            router_aux_loss_coef=0.0,
        )
    else:
        target = dict(
            common,
            architectures=["Qwen3ForCausalLM"],
            model_type="qwen3",
            hidden_size=1024,
            num_hidden_layers=6,
            intermediate_size=1536,
        )
    drafter = {
        k: v
        for k, v in target.items()
        if k
        not in (
            "moe_intermediate_size",
            "num_experts",
            "num_experts_per_tok",
            "norm_topk_prob",
            "decoder_sparse_step",
            "mlp_only_layers",
            "output_router_logits",
            "router_aux_loss_coef",
        )
    }
    drafter.update(
        architectures=["DFlashDraftModel"],
        model_type="qwen3",
        num_hidden_layers=3,
        layer_types=["full_attention"] * 3,
        block_size=16,
        num_target_layers=target["num_hidden_layers"],
        dflash_config={"target_layer_ids": [1, 2, 3], "mask_token_id": 3, "block_size": 16},
    )
    return target, drafter


def embed(tiny_dir: Path, tmp_path_factory, moe: bool) -> Path:
    out = tmp_path_factory.mktemp("moe" if moe else "dense")
    target, drafter = shape_configs(moe)
    embed_models.embed(str(tiny_dir), str(out), target, drafter, ["tiny-qwen3-dflash"], "cpu")
    return out


@pytest.fixture(scope="module")
def dense_dir(tiny_dir, tmp_path_factory) -> Path:
    return embed(tiny_dir, tmp_path_factory, moe=False)


@pytest.fixture(scope="module")
def moe_dir(tiny_dir, tmp_path_factory) -> Path:
    return embed(tiny_dir, tmp_path_factory, moe=True)


DFLASH2 = "tiny-qwen3-dflash2"


@pytest.fixture(scope="module")
def dflash2_models(tiny_dir, tmp_path_factory) -> Path:
    """The tiny target and a DFlash2 drafter: the trained drafter's backbone, its convolutions' taps and its
    selector's tables random and large (the embedding must carry any weights; these move the logits and the
    scores by O(1))."""
    out = tmp_path_factory.mktemp("dflash2-models")
    shutil.copytree(tiny_dir / "tiny-qwen3", out / "tiny-qwen3")
    drafter = train_models.Drafter(train_models.dflash2_dims(TINY_VOCAB))
    plain = train_models.Drafter.from_pretrained(str(tiny_dir / "tiny-qwen3-dflash"))
    missing, _unexpected = drafter.load_state_dict(plain.state_dict(), strict=False)
    params, gen = dict(drafter.named_parameters()), torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name in missing:
            scale = 0.05 if name.endswith("kernel_projection.weight") else 0.5
            params[name].add_(torch.randn(params[name].shape, generator=gen) * scale)
    train_models.save_drafter(drafter, str(out / DFLASH2))
    return out


def embed_dflash2(models: Path, tmp_path_factory, moe: bool) -> Path:
    out = tmp_path_factory.mktemp("dflash2-moe" if moe else "dflash2-dense")
    target, drafter = shape_configs(moe)
    embed_models.embed(str(models), str(out), target, drafter, [DFLASH2], "cpu")
    return out


@pytest.fixture(scope="module")
def dflash2_dense_dir(dflash2_models, tmp_path_factory) -> Path:
    return embed_dflash2(dflash2_models, tmp_path_factory, moe=False)


@pytest.fixture(scope="module")
def dflash2_moe_dir(dflash2_models, tmp_path_factory) -> Path:
    return embed_dflash2(dflash2_models, tmp_path_factory, moe=True)


@functools.cache
def load_target(path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tiny_target(tiny_dir):
    return load_target(tiny_dir / "tiny-qwen3")


@pytest.fixture(scope="module")
def prompts() -> torch.Tensor:
    """Three 40-token texts of the synthetic language."""
    lang, rng = synth_lang.Language(), random.Random(5)
    return torch.tensor([lang.sample_ids(40, rng) for _i in range(3)])


def assert_same_logits(tiny: torch.Tensor, big: torch.Tensor) -> None:
    """Real logits equal; unused ids far below the best real one (never win, no softmax mass)."""
    res = embed_models.compare_logits(tiny, big)
    print(
        "max abs logit diff %.3g, unused ids at least %.0f below the best real one"
        % (res["max_abs_diff"], res["unused_gap"])
    )
    assert res["max_abs_diff"] < 2e-4, res
    assert res["argmax_equal"], res
    assert res["unused_gap"] > 500, res
    assert torch.allclose(torch.softmax(big, -1)[..., :TINY_VOCAB], torch.softmax(tiny, -1), atol=1e-5)


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_target_computes_the_tiny_logits(request, tiny_target, prompts, moe):
    big_dir = request.getfixturevalue("moe_dir" if moe else "dense_dir")
    big = load_target(big_dir / "target")
    with torch.no_grad():
        assert_same_logits(tiny_target(input_ids=prompts).logits, big(input_ids=prompts).logits)


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_drafter_computes_the_tiny_logits(request, tiny_dir, tiny_target, prompts, moe):
    big_dir = request.getfixturevalue("moe_dir" if moe else "dense_dir")
    big = load_target(big_dir / "target")
    tiny_drafter = train_models.Drafter.from_pretrained(str(tiny_dir / "tiny-qwen3-dflash")).eval()
    big_drafter = train_models.Drafter.from_pretrained(str(big_dir / "tiny-qwen3-dflash")).eval()
    # the tiny drafter's [1, 2], plus the shape's last feature layer where it has one beyond them
    assert list(big_drafter.dims.target_layer_ids) == ([1, 2] if moe else [1, 2, 3])
    with torch.no_grad():
        for anchor in (12, 23):
            assert_same_logits(
                embed_models.draft_logits(tiny_target, tiny_drafter, prompts, anchor),
                embed_models.draft_logits(big, big_drafter, prompts, anchor),
            )


def test_layout_of_the_production_shapes():
    """8B: one copy of the stream, ratio 16; 30B-A3B: two copies, ratio 4; both eps positive; the drafter
    reads the tiny layers [1, 2] plus the shape's last ones."""
    tiny = embed_models.Dims(256, 4, 2, 64, 768, 4, 512)
    for hidden, heads, kv, copies, ratio in ((4096, 32, 8, 1, 16), (2048, 32, 4, 2, 4)):
        lay = embed_models.make_layout(tiny, embed_models.Dims(hidden, heads, kv, 128, 768, 36, 151936), 1e-6)
        assert (lay.copies, lay.ratio) == (copies, ratio)
        assert lay.eps > 0 and math.isclose(lay.eps * ratio + embed_models.FLAG**2 / (copies * 256), 1e-6)
        group = heads // kv
        assert sorted(set((lay.q_rows // 128).tolist())) == [0, 1, group, group + 1]
    assert embed_models.drafter_layer_ids([1, 2], [1, 9, 17, 25, 33]) == [1, 2, 17, 25, 33]
    assert embed_models.drafter_layer_ids([1, 2], [1, 12, 23, 34, 45]) == [1, 2, 23, 34, 45]


def test_a_bed_is_reused_only_for_the_same_request(tiny_dir, dense_dir):
    """device-run.sh's warm machine keeps a bed (embed_models.py --reuse) only when it was made the same way."""
    target, drafter = shape_configs(moe=False)
    same = embed_models.embed_request(str(tiny_dir), target, drafter, ["tiny-qwen3-dflash"], 0)
    assert embed_models.existing_bed(str(dense_dir), same)["models"].keys() == {"target", "tiny-qwen3-dflash"}
    for other in (
        embed_models.embed_request(str(tiny_dir), target, drafter, ["tiny-qwen3-dflash"], 1),
        embed_models.embed_request(str(tiny_dir), dict(target, num_hidden_layers=7), drafter, ["tiny-qwen3-dflash"], 0),
    ):
        assert embed_models.existing_bed(str(dense_dir), other) == {}


def assert_same_walk(tiny: tuple, big: tuple, tol: float = 1e-3) -> None:
    """The selector's greedy paths through two lattices are the same, or part where the tiny lattice's two
    choices score within tol of each other (a near-tie the embedding's rounding may break either way)."""
    walks = train_models.lattice_walk(*tiny), train_models.lattice_walk(*big)
    cand, scores = tiny
    for b in range(cand.shape[0]):
        differ = (walks[0][b] != walks[1][b]).nonzero()
        if not len(differ):
            continue
        e = int(differ[0])
        prev = 0 if e == 0 else int((cand[b, e - 1] == walks[0][b, e - 1]).nonzero()[0])
        row = scores[b, e, prev]
        other = (cand[b, e] == walks[1][b, e]).nonzero()
        assert len(other), "row %d slot %d: the embedded path takes a token outside the tiny candidates" % (b, e)
        gap = float(row.max() - row[int(other[0])])
        assert gap < tol, "row %d slot %d: paths part where the tiny scores differ by %.4g" % (b, e, gap)


def test_lattices_compare_up_to_the_order_of_candidates():
    """compare_lattices aligns candidates by token: a lattice with two candidates swapped (their scores swapped
    with them, as slot e's columns and slot e+1's rows) is the same lattice; a changed score is not."""
    gen = torch.Generator().manual_seed(0)
    cand = torch.stack([torch.randperm(50, generator=gen)[:4] for _e in range(3)])[None]  # [1, E 3, K 4]
    scores = torch.randn(1, 3, 4, 4, generator=gen)
    scores[:, 0] = scores[:, 0, :1]  # slot 0: every row the anchor's
    swap = torch.tensor([1, 0, 2, 3])
    cand2, scores2 = cand.clone(), scores.clone()
    cand2[:, 1] = cand[:, 1, swap]
    scores2[:, 1] = scores[:, 1][..., swap]
    scores2[:, 2] = scores[:, 2][:, swap]
    res = embed_models.compare_lattices((cand, scores), (cand2, scores2))
    assert res["candidates_equal"] and not res["same_order"] and res["max_abs_score_diff"] == 0.0
    scores2[0, 2, 3, 1] += 0.5
    assert embed_models.compare_lattices((cand, scores), (cand2, scores2))["max_abs_score_diff"] == 0.5
    assert_same_walk((cand, scores), (cand2, scores2))


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_dflash2_drafter_computes_the_tiny_lattice(request, dflash2_models, tiny_target, prompts, moe):
    """The embedded DFlash2 drafter (DFlash2DraftModel, the tiny convolutions and selector in the big shape):
    the tiny logits, the tiny candidates, transition scores and greedy path, on each target's features and
    through each target's lm_head (the dense shape holds one copy of the stream, the MoE one two)."""
    big_dir = request.getfixturevalue("dflash2_moe_dir" if moe else "dflash2_dense_dir")
    big = load_target(big_dir / "target")
    cfg = json.loads((big_dir / DFLASH2 / "config.json").read_text())
    tiny_cfg = json.loads((dflash2_models / DFLASH2 / "config.json").read_text())
    assert cfg["architectures"] == ["DFlash2DraftModel"]
    for key in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"):
        assert cfg["dflash_config"][key] == tiny_cfg["dflash_config"][key]
    tiny_drafter = train_models.Drafter.from_pretrained(str(dflash2_models / DFLASH2)).eval()
    big_drafter = train_models.Drafter.from_pretrained(str(big_dir / DFLASH2)).eval()
    assert big_drafter.candidate_selector.predecessor_codebook.shape == (
        cfg["vocab_size"],
        cfg["dflash_config"]["selector_rank"],
    )
    with torch.no_grad():
        for anchor in (12, 23):
            assert_same_logits(
                embed_models.draft_logits(tiny_target, tiny_drafter, prompts, anchor),
                embed_models.draft_logits(big, big_drafter, prompts, anchor),
            )
            tiny = embed_models.draft_lattice(tiny_target, tiny_drafter, prompts, anchor)
            embedded = embed_models.draft_lattice(big, big_drafter, prompts, anchor)
            res = embed_models.compare_lattices(tiny, embedded)
            print("anchor %d: %s" % (anchor, res))
            assert res["candidates_equal"] and res["max_abs_score_diff"] < 1e-3, res
            assert_same_walk(tiny, embedded)
