"""The harness's training (tests/gpu_sglang/train_models.py): the offline acceptance the drafter levels report
(DFLASH's chain and a DDTree built by the overlay's core, along the target's greedy text), and the DFlash2
drafter of --dflash2 against SGLang's own DFlash2 code (below)."""

import ast
import json
import random
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from ._sglang_source import definitions, sglang_root, source_text  # noqa: E402
from .test_embed_models import load_harness, load_target  # noqa: E402

VOCAB = 32


def logits_ranking(rows):
    """[L, VOCAB] logits whose top candidates at position i are rows[i], best first."""
    out = torch.full((len(rows), VOCAB), -10.0)
    for i, ranked in enumerate(rows):
        for r, token in enumerate(ranked):
            out[i, token] = 5.0 - r
    return out


def test_chain_accepts_the_leading_argmax_matches():
    tm = load_harness("train_models")
    logits = logits_ranking([[3, 4], [5, 6], [7, 8]])
    assert tm.chain_accepted(logits, torch.tensor([3, 5, 9])) == 2
    assert tm.chain_accepted(logits, torch.tensor([4, 5, 7])) == 0


def test_tree_recovers_a_second_candidate_the_chain_misses():
    tm = load_harness("train_models")
    logits = logits_ranking([[3, 4], [5, 6], [7, 8]])
    truth = torch.tensor([4, 5, 7])  # the drafter's second choice first, then its first choices
    assert tm.chain_accepted(logits, truth) == 0
    assert tm.tree_accepted(logits, truth, budget=15) == 3
    assert tm.tree_accepted(logits, truth, budget=1) == 0  # one node: the chain's first only


def test_tree_stops_at_a_token_outside_its_nodes():
    tm = load_harness("train_models")
    logits = logits_ranking([[3, 4], [5, 6], [7, 8]])
    assert tm.tree_accepted(logits, torch.tensor([3, 9, 7]), budget=15) == 1


def test_offline_acceptance_over_longer_outputs_reports_the_chain_and_each_tree(tiny_dir):
    oa = load_harness("offline_accept")
    got = oa.offline_acceptance(str(tiny_dir), ["tiny-qwen3-dflash"], 48, [1, 63], 2, torch.device("cpu"))
    row = got["tiny-qwen3-dflash"]
    assert set(row) == {"chain", "1", "63"}
    # one node verifies only the chain's first token: at most 2 a step (it plus the bonus)
    assert 1.0 <= row["1"] <= 2.0
    # the trained pair's drafter accepts most of its block, and 63 nodes hold its chain and more
    assert row["chain"] > 4.0 and row["63"] >= row["chain"]


# ---- the DFlash2 drafter (train_models.py --dflash2) against SGLang's own DFlash2 code ----------------------
#
# SGLang's definitions run from its installed source (_sglang_source: its modules import torchvision and GPU
# kernel libraries that have no CPU build here). The only restatements: SGLang's RMSNorm call convention
# (SGLangNorm) and the target's lm_head as an object with a weight; attention and MLP inside SGLang's decoder
# layer are the harness's (what the test checks is around them: the convolutions and the residual).

D2 = "tiny-qwen3-dflash2"
ANCHORS = (12, 23)
requires_sglang_source = pytest.mark.skipif(sglang_root() is None, reason="sglang is not installed")


def sglang_dflash():
    """SGLang's DFlash2 pieces from sglang/srt/models/dflash.py."""
    names = [
        "_grouped_conv",
        "DFlashGroupedConv",
        "_score_edges",
        "_follow_maps",
        "CandidateSelector",
        "_radix_topk",
        "_project_candidate_logits",
        "DFlashDecoderLayer.forward",
        "DFlash2DraftModel._transform_unary_logits",
    ]
    return definitions("srt/models/dflash.py", names, _flashinfer_top_k=None, selector_walk_triton=None)


def sglang_parse_config(cfg: dict):
    """SGLang's parse_dflash_draft_config (sglang/srt/speculative/dflash_utils.py) of a config.json."""
    names = [
        "DEFAULT_DFLASH_MASK_TOKEN",
        "_cfg_get",
        "_get_text_config",
        "_get_dflash_config",
        "_parse_optional_int",
        "build_target_layer_ids",
        "DFlashDraftConfig",
        "parse_dflash_draft_config",
    ]
    return definitions("srt/speculative/dflash_utils.py", names).parse_dflash_draft_config(draft_hf_config=cfg)


class SGLangNorm:
    """SGLang's RMSNorm call convention over the harness's rms: norm(x), or norm(x, residual) ->
    (norm(x + residual), x + residual)."""

    def __init__(self, tm, weight, eps):
        self.tm, self.weight, self.eps = tm, weight, eps

    def __call__(self, x, residual=None):
        if residual is None:
            return self.tm.rms(x, self.weight, self.eps)
        total = x + residual
        return self.tm.rms(total, self.weight, self.eps), total


@pytest.fixture(scope="module")
def dflash2_dir(tiny_dir, tmp_path_factory) -> Path:
    """--dflash2 --quick end to end for the trained tiny target (copied: the run writes beside it)."""
    out = tmp_path_factory.mktemp("dflash2")
    shutil.copytree(tiny_dir / "tiny-qwen3", out / "tiny-qwen3")
    tm = load_harness("train_models")
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("SYNTH_LANG", raising=False)
        mp.setattr(sys, "argv", ["train_models.py", str(out), "--dflash2", D2, "--quick"])
        tm.main()
    return out


@pytest.fixture(scope="module")
def target(tiny_dir):
    return load_target(tiny_dir / "tiny-qwen3")


@pytest.fixture(scope="module")
def texts() -> torch.Tensor:
    """Three 40-token texts of the synthetic language."""
    lang, rng = load_harness("synth_lang").Language(), random.Random(5)
    return torch.tensor([lang.sample_ids(40, rng) for _i in range(3)])


@pytest.fixture(scope="module")
def loud(dflash2_dir, tmp_path_factory) -> SimpleNamespace:
    """The quick drafter with its taps and selector tables made large (20 CPU steps leave them near their
    start: identity taps, a bilinear term of ~1e-3), every weight rounded to bf16 (the export's dtype), then
    exported by the harness: `drafter`, the module in memory, and `dir`, its export, which SGLang's modules
    load. A wrong table, tap or transpose in the export then moves SGLang's scores by O(1) from the harness's."""
    tm = load_harness("train_models")
    drafter = tm.Drafter.from_pretrained(str(dflash2_dir / D2))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if name.endswith("base_kernel") or name.startswith("candidate_selector."):
                p.add_(torch.randn(p.shape, generator=gen) * 0.5)
            elif name.endswith("kernel_projection.weight"):
                p.add_(torch.randn(p.shape, generator=gen) * 0.05)
            p.copy_(p.to(torch.bfloat16).float())
    out = tmp_path_factory.mktemp("loud") / D2
    tm.save_drafter(drafter, str(out))
    return SimpleNamespace(dir=out, drafter=drafter.eval())


def sglang_load_weights(params: dict, weights: list) -> None:
    """SGLang's DFlashDraftModel.load_weights (its name resolution, stacked q/k/v and gate/up mapping, and
    default_weight_loader's shape check) into a model whose parameters are `params` (SGLang name -> tensor):
    exported names it does not resolve are ignored, as SGLang ignores them."""
    loader = definitions("srt/model_loader/weight_utils.py", ["default_weight_loader"]).default_weight_loader
    load = definitions("srt/models/dflash.py", ["DFlashDraftModel.load_weights"], default_weight_loader=loader)
    model = SimpleNamespace(named_parameters=lambda: iter(params.items()), projector_type=None)
    load.load_weights(model, weights)


def sglang_modules(path: Path, sg) -> SimpleNamespace:
    """SGLang's convolutions and selector built from the exported config.json as DFlash2DraftModel builds them
    (the names their parameters have there), loaded from the exported weights by SGLang's load_weights."""
    from safetensors.torch import load_file

    cfg = json.loads((path / "config.json").read_text())
    dc = sglang_parse_config(cfg)
    hidden, block = cfg["hidden_size"], dc.resolve_block_size(default=16)
    convs = [
        {
            side: sg.DFlashGroupedConv(hidden, block, dc.conv_kernel_size, dc.conv_group_size)
            for side in ("attention_conv", "mlp_conv")
        }
        for _i in range(cfg["num_hidden_layers"])
    ]
    selector = sg.CandidateSelector(
        hidden_size=hidden, vocab_size=cfg["vocab_size"], state_rank=dc.selector_rank, top_k=dc.selector_top_k
    )
    params = {"candidate_selector." + n: p for n, p in selector.named_parameters()}
    for i, layer in enumerate(convs):
        for side, conv in layer.items():
            params.update({"layers.%d.%s.%s" % (i, side, n): p for n, p in conv.named_parameters()})
    with torch.no_grad():
        for p in params.values():
            p.fill_(float("nan"))  # what load_weights leaves unloaded shows
    state = load_file(str(path / "model.safetensors"))
    sglang_load_weights(params, [(name, w.float()) for name, w in state.items()])
    return SimpleNamespace(cfg=cfg, dc=dc, state=state, params=params, convs=convs, selector=selector)


@requires_sglang_source
def test_dflash2_quick_run_exports_what_sglang_loads(dflash2_dir):
    """The quick run's export: DFlash2DraftModel (an EntryClass of SGLang's dflash.py), SGLang's own parse of
    its dflash_config, and beyond a DFlash drafter's weights exactly the parameters SGLang's convolutions
    and selector hold, by their names in DFlash2DraftModel, in their shapes."""
    tm = load_harness("train_models")
    sgm = sglang_modules(dflash2_dir / D2, sglang_dflash())
    text = source_text("srt/models/dflash.py")
    entry = next(n for n in ast.parse(text).body if isinstance(n, ast.Assign) and n.targets[0].id == "EntryClass")
    assert sgm.cfg["architectures"] == ["DFlash2DraftModel"] and "DFlash2DraftModel" in [e.id for e in entry.value.elts]
    dc = sgm.dc
    assert (dc.conv_kernel_size, dc.conv_group_size) == (tm.DFLASH2_CONV_TAPS, tm.DFLASH2_CONV_GROUP)
    assert (dc.selector_rank, dc.selector_top_k) == (tm.DFLASH2_RANK, tm.DFLASH2_TOP_K)
    assert (dc.block_size, dc.target_layer_ids, dc.mask_token_id) == (16, [1, 2], 3)
    # the attributes DFlash2DraftModel and its decoder layers keep them under, in SGLang's source
    for line in (
        "self.candidate_selector = CandidateSelector(",
        "self.attention_conv = attention_conv",
        "self.mlp_conv = mlp_conv",
    ):
        assert line in text
    assert set(sgm.state) - set(tm.Drafter(tm.TINY_DRAFT).state_for_sglang()) == set(sgm.params)
    for name, param in sgm.params.items():  # every one loaded by SGLang's load_weights, from its own name
        assert torch.equal(param, sgm.state[name].float()), name
    report = json.loads((dflash2_dir / ("train-%s.json" % D2)).read_text())["dflash2_offline_accept"]
    assert {"lattice_chain", "marginal_chain", "marginal_tree_15"} <= set(report)


def test_dflash2_export_reads_back(loud):
    """Drafter.from_pretrained (embed_models reads drafters with it) gives back every weight of the export."""
    tm = load_harness("train_models")
    back = dict(tm.Drafter.from_pretrained(str(loud.dir)).named_parameters())
    own = dict(loud.drafter.named_parameters())
    assert back.keys() == own.keys()
    for name, p in own.items():
        assert torch.equal(back[name], p), name


@requires_sglang_source
def test_grouped_convolution_is_sglangs(loud):
    """Each exported convolution, prepare and finish, in the harness's [blocks, 16, H] and in SGLang's flat rows
    (its position in block: the row index modulo block_size), on three blocks of random rows."""
    sgm, drafter = sglang_modules(loud.dir, sglang_dflash()), loud.drafter
    gen = torch.Generator().manual_seed(1)
    x, y = (torch.randn(3 * 16, drafter.dims.hidden, generator=gen) for _i in range(2))
    with torch.no_grad():
        for i, m in enumerate(drafter.layers):
            for side in ("attention_conv", "mlp_conv"):
                ours, theirs = getattr(m, side), sgm.convs[i][side]
                a, kernel = ours.prepare(x.view(3, 16, -1))
                b, their_kernel = theirs.prepare(x)
                assert (a.reshape(b.shape) - x).abs().max() > 0.5  # the taps move the rows
                torch.testing.assert_close(a.reshape(b.shape), b, rtol=1e-5, atol=1e-5)
                torch.testing.assert_close(
                    ours.finish(y.view(3, 16, -1), kernel).reshape(b.shape),
                    theirs.finish(y, their_kernel),
                    rtol=1e-5,
                    atol=1e-5,
                )


def two_blocks(tm, drafter, target, seqs):
    """The drafter's inputs for blocks at ANCHORS of one sequence: (features, context mask, embeddings, positions)."""
    feats = tm.features(target, seqs, drafter.dims.target_layer_ids)
    anchors = torch.tensor(ANCHORS)
    ids = torch.full((1, len(ANCHORS), 16), tm.sl.MASK_ID)
    ids[0, :, 0] = seqs[0, anchors]
    pos = (anchors[:, None] + torch.arange(16))[None]
    ctx_mask = (torch.arange(seqs.shape[1])[None, :] < anchors.repeat_interleave(16)[:, None])[None]
    return feats, ctx_mask, target.get_input_embeddings()(ids), pos


def sglang_draft_hidden(sg, sgm, tm, drafter, inputs):
    """DFlashDraftModel.forward's layer loop and final norm as SGLang runs them (DFlashDecoderLayer.forward:
    the norms, the convolutions' prepare/finish and the residual), around the harness's attention and MLP."""
    feats, ctx_mask, emb, pos = inputs
    attend = drafter.attender(feats, ctx_mask, pos)
    eps, hidden, residual = drafter.dims.eps, emb.reshape(-1, emb.shape[-1]).float(), None
    for i, m in enumerate(drafter.layers):
        layer = SimpleNamespace(
            input_layernorm=SGLangNorm(tm, m.input_layernorm, eps),
            post_attention_layernorm=SGLangNorm(tm, m.post_attention_layernorm, eps),
            attention_conv=sgm.convs[i]["attention_conv"],
            mlp_conv=sgm.convs[i]["mlp_conv"],
            self_attn=lambda positions, hidden_states, forward_batch, m=m: attend(m, hidden_states[None])[0],
            mlp=lambda x, m=m: drafter.mlp(m, x),
        )
        hidden, residual = sg.forward(layer, pos.reshape(-1), hidden, None, residual)
    return SGLangNorm(tm, drafter.norm, eps)(hidden, residual)[0]


@requires_sglang_source
def test_drafter_layers_are_sglangs(loud, target, texts):
    """The harness's drafter forward equals SGLang's decoder layers over the same weights (two blocks of one
    sequence, flattened as SGLang's batch is)."""
    tm, sg = load_harness("train_models"), sglang_dflash()
    sgm, drafter = sglang_modules(loud.dir, sg), loud.drafter
    with torch.no_grad():
        inputs = two_blocks(tm, drafter, target, texts[:1])
        ours = drafter(*inputs)
        theirs = sglang_draft_hidden(sg, sgm, tm, drafter, inputs)
    torch.testing.assert_close(ours.reshape(theirs.shape), theirs, rtol=1e-4, atol=1e-4)


@requires_sglang_source
def test_lattice_and_greedy_walk_are_sglangs(loud, target, texts):
    """The lattice of the two blocks' rows 1..15 (SGLang's _selector_lattice: compute_candidates through the
    target's lm_head, then build_lattice with the block's root as slot 0's predecessor) and its greedy path
    (CandidateSelector.sample_path, greedy rows) equal the harness's."""
    tm, sg = load_harness("train_models"), sglang_dflash()
    sgm, drafter = sglang_modules(loud.dir, sg), loud.drafter
    head = target.lm_head.weight.float()
    with torch.no_grad():
        rows = drafter(*two_blocks(tm, drafter, target, texts[:1]))[0, :, 1:]  # [blocks, 15, H]
        anchor = texts[0, list(ANCHORS)]
        cand, scores = drafter.lattice(rows, anchor, head)
        flat = rows.reshape(-1, rows.shape[-1])
        logits = sg._project_candidate_logits(
            flat, SimpleNamespace(weight=head), num_org=head.shape[0], use_quant_head=False
        )
        vals, ids = sg._radix_topk(logits, sgm.dc.selector_top_k)
        unary = sg._transform_unary_logits(SimpleNamespace(draft_config=sgm.dc), vals).view(*rows.shape[:2], -1)
        ids = ids.long().view(*rows.shape[:2], -1)
        theirs = sgm.selector.build_lattice(
            candidate_ids=ids, unary_logits=unary, hidden_states=rows, anchor_token_ids=anchor
        )
        n = len(ANCHORS)
        tokens, _q = sgm.selector.sample_path(
            candidate_ids=ids,
            scores=theirs,
            uniforms=torch.zeros(n, 15),
            temperatures=torch.ones(n),
            greedy_mask=torch.ones(n, dtype=torch.bool),
        )
    assert torch.equal(cand, ids)
    assert (theirs - unary[:, :, None]).abs().max() > 0.5  # the transitions move the scores
    torch.testing.assert_close(scores, theirs, rtol=1e-4, atol=1e-4)
    assert torch.equal(tm.lattice_walk(cand, scores), tokens)


@requires_sglang_source
def test_unary_transform_is_sglangs(loud):
    """dflash_config's output_multiplier and final_logit_softcapping, read by the harness and by SGLang, give
    the same unary logits."""
    tm = load_harness("train_models")
    cfg = json.loads((loud.dir / "config.json").read_text())
    cfg["dflash_config"].update(output_multiplier=0.5, final_logit_softcapping=3.0)
    drafter = tm.Drafter(tm.draft_dims_from_config(cfg))
    vals = torch.linspace(-20, 20, 41)
    theirs = sglang_dflash()._transform_unary_logits(
        SimpleNamespace(draft_config=sglang_parse_config(cfg)), vals.clone()
    )
    torch.testing.assert_close(drafter.transform_unary(vals), theirs)
    assert theirs.abs().max() < 3.0


def test_selector_loss_teaches_the_walk_a_continuation_the_marginals_miss():
    """Rows whose marginal argmax is never the continuation, whose second candidate is: trained on
    selector_loss alone, the selector's greedy walk follows the whole continuation."""
    tm = load_harness("train_models")
    torch.manual_seed(0)
    drafter = tm.Drafter(tm.dflash2_dims(VOCAB))
    hid = torch.randn(1, 1, 16, drafter.dims.hidden)
    head = torch.randn(VOCAB, drafter.dims.hidden) * 0.05
    logits = hid[:, :, 1:] @ head.T
    labels = torch.cat([torch.tensor([[[5]]]), logits.topk(2, -1).indices[..., 1]], -1)  # the second choices
    wpos = torch.ones(15)
    sel = drafter.candidate_selector
    opt = torch.optim.Adam(sel.parameters(), lr=0.05)
    for _step in range(150):
        loss = tm.selector_loss(drafter, hid, logits, labels, wpos)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        cand, scores = drafter.lattice(hid[0, 0, 1:], labels[0, 0, 0], head)
    assert tm.chain_accepted(logits[0, 0], labels[0, 0, 1:]) == 0
    assert torch.equal(tm.lattice_walk(cand, scores), labels[0, 0, 1:])


def test_checks_on_real_text_come_every_25_steps():
    tm = load_harness("train_models")
    real = [s for s in range(200) if tm.check_due(s, "levels", False, synthetic=False)]
    assert real == [25, 50, 75, 100, 125, 150, 175]
    synthetic = [s for s in range(130) if tm.check_due(s, "levels", False, synthetic=True)]
    assert synthetic == list(range(25, 100)) + [100, 125]


def test_early_stop_keeps_the_best_checkpoint_by_held_out_loss(monkeypatch):
    tm = load_harness("train_models")
    monkeypatch.setattr(tm, "TARGET_PATIENCE", 3)
    model = torch.nn.Linear(2, 1)
    losses = iter([3.0, 2.0, 2.5, 2.4, 2.6])
    stopper = tm.EarlyStop(model, lambda: next(losses), lambda _msg: None)
    stops = []
    for step in range(5):
        with torch.no_grad():
            model.weight.fill_(float(step))
        stops.append(stopper.stop(step))
    assert stops == [False, False, False, False, True]  # the third check without a new best ends training
    stopper.restore()
    assert stopper.best_step == 1 and model.weight[0, 0].item() == 1.0
