"""The hybrid test bed (tests/gpu_sglang/train_hybrid.py, hybrid_check.py) on the CPU: its --quick run end to
end, and what SGLang 0.5.23 makes of the exported target without a GPU: the config class it builds (its own
Qwen3_5TextConfig, imported alone) is a Gated DeltaNet layout for the overlay (hybrid.classify_hybrid), its
layers are the ones Transformers trained, its recurrent state shapes are hybrid.state_shapes_of's, and every
exported weight name reaches a parameter of SGLang's model (its load_weights and module sources, read with ast)."""

import ast
import contextlib
import importlib.util
import json
import sys
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from sglang_overlay.adapter import hybrid, settings  # noqa: E402

from .test_embed_models import load_harness  # noqa: E402

train_hybrid = load_harness("train_hybrid")
train_models = load_harness("train_models")


@pytest.fixture(scope="module")
def quick_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("hybrid")
    argv = sys.argv
    sys.argv = ["train_hybrid.py", str(out), "--quick"]
    try:
        train_hybrid.main()
    finally:
        sys.argv = argv
    return out


def target_config(quick_dir) -> dict:
    return json.loads((quick_dir / train_hybrid.TARGET_DIR / "config.json").read_text())


def sglang_root() -> Path:
    spec = importlib.util.find_spec("sglang")
    if spec is None:
        pytest.skip("sglang is not installed")
    return Path(spec.submodule_search_locations[0])


@contextlib.contextmanager
def sglang_configs():
    """SGLang's configs.qwen3_5 / configs.qwen3_next, imported without configs/__init__ (it imports the
    multimodal stack); the modules imported under the stand-in package are dropped afterwards."""
    root = sglang_root()
    import sglang.srt  # noqa: F401

    before = set(sys.modules)
    saved = sys.modules.get("sglang.srt.configs")
    pkg = types.ModuleType("sglang.srt.configs")
    pkg.__path__ = [str(root / "srt" / "configs")]
    sys.modules["sglang.srt.configs"] = pkg
    try:
        import sglang.srt.configs.qwen3_5 as q35
        import sglang.srt.configs.qwen3_next as qn

        yield q35, qn
    finally:
        for name in set(sys.modules) - before:
            if name.startswith("sglang.srt.configs."):
                del sys.modules[name]
        if saved is not None:
            sys.modules["sglang.srt.configs"] = saved
        else:
            sys.modules.pop("sglang.srt.configs", None)


def sglang_text_config(cfg: dict, monkeypatch):
    """The config SGLang builds for the target, and its recurrent cache parameters (attention TP 1)."""
    with sglang_configs() as (q35, qn):
        config = q35.Qwen3_5TextConfig(
            **{k: v for k, v in cfg.items() if k not in ("model_type", "transformers_version")}
        )
        monkeypatch.setattr(qn, "_is_cpu", False)
        monkeypatch.setattr(qn, "linear_attn_tp_size", lambda: 1)
        return config, isinstance(config, qn.Qwen3NextConfig), config.mamba2_cache_params


def test_quick_run_writes_a_target_and_a_drafter_sglang_can_load(quick_dir):
    record = json.loads((quick_dir / "train-hybrid.json").read_text())
    assert record["drafter"]["target_layer_ids"] == list(train_hybrid.TARGET_LAYER_IDS)
    assert record["drafter"]["steps"] >= 1 and record["drafter"]["checks"]
    cfg = target_config(quick_dir)
    assert cfg["architectures"] == ["Qwen3_5ForCausalLM"] and cfg["model_type"] == "qwen3_5_text"
    assert cfg["mamba_ssm_dtype"] == "float32"
    kinds = cfg["layer_types"]
    assert "linear_attention" in kinds and "full_attention" in kinds
    drafter_dir = quick_dir / train_hybrid.DRAFTER_DIR
    dcfg = json.loads((drafter_dir / "config.json").read_text())
    assert dcfg["architectures"] == ["DFlashDraftModel"] and dcfg["num_target_layers"] == cfg["num_hidden_layers"]
    ids = dcfg["dflash_config"]["target_layer_ids"]
    # SGLang's Qwen3_5ForCausalLM.set_dflash_layers_to_capture: unique, increasing, in [0, layers - 1)
    assert ids == sorted(set(ids)) and all(0 <= i < cfg["num_hidden_layers"] - 1 for i in ids)
    drafter = train_models.Drafter.from_pretrained(str(drafter_dir))
    assert drafter.dims.target_layer_ids == tuple(ids)
    target = train_hybrid.load_target(str(quick_dir / train_hybrid.TARGET_DIR), torch.device("cpu"), torch.float32)
    with torch.no_grad():
        hidden = target(input_ids=torch.tensor([[5, 6, 7, 8]]), output_hidden_states=True).hidden_states
    feats = torch.cat([hidden[k + 1] for k in ids], -1)
    assert feats.shape[-1] == drafter.fc.in_features


def test_the_overlay_classifies_the_target_as_gated_deltanet(quick_dir, monkeypatch):
    cfg = target_config(quick_dir)
    assert settings.hybrid_target_reason(cfg) is not None
    config, is_gdn, params = sglang_text_config(cfg, monkeypatch)
    assert is_gdn  # SGLang's hybrid_gdn_config takes any Qwen3NextConfig
    verdict = hybrid.classify_hybrid(type(config).__name__)
    assert verdict.status == hybrid.TREE and verdict.layout == "GDN"
    # SGLang's layers (full_attention_interval) are the ones Transformers trained (layer_types)
    assert [{"attention": "full_attention"}.get(k, k) for k in config.layers_block_type] == cfg["layer_types"]
    shapes = hybrid.state_shapes_of(cfg)
    assert shapes.num_layers == len(params.layers)
    assert [tuple(c) for c in params.shape.conv] == [tuple(c) for c in shapes.conv]
    assert tuple(params.shape.temporal) == tuple(shapes.temporal)
    assert shapes.ssm_dtype_bytes == torch.tensor([], dtype=params.dtype.temporal).element_size()
    # the full attention's RoPE: SGLang reads partial_rotary_factor and rope_theta as Transformers does
    assert config.partial_rotary_factor == cfg["rope_parameters"]["partial_rotary_factor"]
    assert config.rope_parameters["rope_theta"] == cfg["rope_parameters"]["rope_theta"]


def classes_of(*paths) -> dict:
    """Class name -> ast.ClassDef over the given sources (the first definition wins)."""
    out = {}
    for path in paths:
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef):
                out.setdefault(node.name, node)
    return out


def callee(value) -> str:
    func = value.func if isinstance(value, ast.Call) else None
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def assigned(cls: ast.ClassDef) -> dict:
    """self.X = CALL(...) anywhere in the class's methods: X -> the names of the callables."""
    out = {}
    for node in ast.walk(cls):
        if not isinstance(node, ast.Assign):
            continue
        for target in node.targets:
            elts = target.elts if isinstance(target, ast.Tuple) else [target]
            for elt in elts:
                if isinstance(elt, ast.Attribute) and isinstance(elt.value, ast.Name) and elt.value.id == "self":
                    out.setdefault(elt.attr, set()).add(callee(node.value))
    return out


def reaches(classes, cls: str, parts: list, layer_classes: dict) -> bool:
    """Whether the dotted name `parts` names a parameter of SGLang's module class `cls`."""
    attrs = assigned(classes[cls])
    if not parts or parts[0] not in attrs:
        return False
    head, rest, made = parts[0], parts[1:], attrs[parts[0]]
    if head == "layers":
        return (
            bool(rest) and rest[0].isdigit() and reaches(classes, layer_classes[int(rest[0])], rest[1:], layer_classes)
        )
    if any(c in classes and reaches(classes, c, rest, layer_classes) for c in made):
        return True
    return rest == [] if "Parameter" in made else rest in (["weight"], ["bias"])


def load_weights_mapping(classes) -> list:
    """The stacked_params_mapping literal of Qwen3_5ForCausalLM.load_weights (the dense body)."""
    fn = next(
        n for n in classes["Qwen3_5ForCausalLM"].body if isinstance(n, ast.FunctionDef) and n.name == "load_weights"
    )
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "stacked_params_mapping":
            return ast.literal_eval(node.value)
    raise AssertionError("no stacked_params_mapping in Qwen3_5ForCausalLM.load_weights")


def sglang_name(name: str, mapping: list) -> str:
    """An exported body weight's name as SGLang's Qwen3_5ForCausalLM.load_weights renames it."""
    name = name.replace(".self_attn", "")
    for param_name, weight_name, _shard in mapping:
        if weight_name in name:
            return name.replace(weight_name, param_name)
    return name


def test_every_exported_weight_reaches_a_parameter_of_sglangs_model(quick_dir, monkeypatch):
    from safetensors import safe_open

    root = sglang_root() / "srt" / "models"
    wrapper_src = (root / "qwen3_5_text.py").read_text(encoding="utf-8")
    assert '_MODEL_PREFIX = "model."' in wrapper_src and "self.lm_head = ParallelLMHead(" in wrapper_src
    classes = classes_of(root / "qwen3_5.py", root / "qwen2_moe.py")
    kinds_node = next(
        n
        for n in ast.parse((root / "qwen3_5.py").read_text(encoding="utf-8")).body
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == "ALL_DECODER_LAYER_TYPES"
    )
    by_kind = {k.value: v.id for k, v in zip(kinds_node.value.keys, kinds_node.value.values)}
    config, _is_gdn, _params = sglang_text_config(target_config(quick_dir), monkeypatch)
    layer_classes = [by_kind[k] for k in config.layers_block_type]
    mapping = load_weights_mapping(classes)
    with safe_open(str(quick_dir / train_hybrid.TARGET_DIR / "model.safetensors"), "pt") as fh:
        names = sorted(fh.keys())
    assert "lm_head.weight" in names
    body = [n for n in names if n != "lm_head.weight"]
    assert all(n.startswith("model.") for n in body)
    lost = [
        n
        for n in body
        if not reaches(classes, "Qwen3_5ForCausalLM", sglang_name(n[6:], mapping).split("."), layer_classes)
    ]
    assert not lost, "SGLang's Qwen3_5ForCausalLM has no parameter for %s" % lost[:6]


def test_exported_gdn_weights_match_the_state_shapes(quick_dir):
    from safetensors import safe_open

    cfg = target_config(quick_dir)
    shapes = hybrid.state_shapes_of(cfg)
    (conv_dim, window), (value_heads, _vdim, _kdim) = shapes.conv[0], shapes.temporal
    first_linear = cfg["layer_types"].index("linear_attention")
    with safe_open(str(quick_dir / train_hybrid.TARGET_DIR / "model.safetensors"), "pt") as fh:
        p = "model.layers.%d.linear_attn." % first_linear
        assert list(fh.get_slice(p + "conv1d.weight").get_shape()) == [conv_dim, 1, window + 1]
        assert list(fh.get_slice(p + "A_log").get_shape()) == [value_heads]


def fake_results(hc, control_moves: bool) -> dict:
    """Servers' raw results: every DDTREE server as NONE; the control's sampled t2 all one token when it moves."""
    outs = [{"ids": [1, 2, 3]}, {"ids": [4, 5, 6]}]
    samples = {"0": [[7, 8 + i % 3, 9, 9, 9] for i in range(300)]}
    moved = {"0": [[7, 8, 9, 9, 9] for _i in range(300)]}
    base = {"greedy": {c: {"outputs": outs} for c in ("c1", "c16")}, "sampled": {"samples": samples}}
    res = {name: dict(base) for name, _b, _k in hc.TREES}
    res[hc.NONE] = dict(base)
    res[hc.CONTROL] = dict(base, sampled={"samples": moved if control_moves else samples})
    return res


def test_hybrid_check_holds_only_when_the_control_is_rejected():
    hc = load_harness("hybrid_check")
    for moves in (True, False):
        results = fake_results(hc, moves)
        greedy, chi = hc.compare(results)
        got = hc.verdict(greedy, chi, results)
        assert got["lossless"] and got["answered"]
        assert got["control_rejected"] is moves and got["holds"] is moves


def test_hybrid_check_counts_a_divergence_that_is_no_near_tie():
    hc = load_harness("hybrid_check")
    results = fake_results(hc, True)
    name = hc.TREES[1][0]
    results[name] = dict(
        results[name], greedy={c: {"outputs": [{"ids": [1, 2, 0]}, {"ids": [4, 5, 6]}]} for c in ("c1", "c16")}
    )
    greedy, chi = hc.compare(results)
    for cmp_ in greedy.values():
        for fd in cmp_["first_diff"]:
            fd["near_tie"] = False  # margins() sets it from the target's top-2 probabilities
    got = hc.verdict(greedy, chi, results)
    assert not got["lossless"] and not got["holds"]
    assert got["divergences_not_near_tie"]["%s_vs_none_c1" % name] == 1


def test_hybrid_check_servers_and_requests():
    hc = load_harness("hybrid_check")
    none, group = hc.servers("/tmp/out", "/models")
    assert none.algo == "NONE" and "--speculative-ddtree-allow-hybrid-unsafe" not in none.args
    for s in group:
        assert s.algo == "DDTREE" and "--speculative-ddtree-allow-hybrid-unsafe" in s.args
        assert s.args[s.args.index("--model-path") + 1] == "/models/tiny-hybrid"
        assert s.args[s.args.index("--speculative-draft-model-path") + 1] == "/models/tiny-hybrid-dflash"
        assert s.args[s.args.index("--mamba-ssm-dtype") + 1] == "float32"
    budgets = {s.name: s.args[s.args.index("--speculative-ddtree-budget") + 1] for s in group}
    assert budgets[hc.CONTROL] == budgets[hc.TREES[0][0]] and sorted(set(budgets.values())) == ["15", "31"]
    assert [s.env.get("DDTREE_HYBRID_CHAIN_STATE") for s in group] == [None] * (len(group) - 1) + ["1"]
    assert len({s.port for s in [none] + group}) == len(group) + 1
    prompts, lengths = hc.prompts_and_lengths(hc.sl.Language())
    words = [len(p.split()) for p in prompts]
    assert max(words) > 4 * min(words) and len(set(lengths)) > 8 and min(lengths) < 16


def test_the_target_trains_fewer_steps_when_its_pace_would_pass_the_limit():
    assert train_hybrid.tm.fit_steps(1500, 20, 1.0, 80) == 1500  # 50 ms a step: 75 s
    assert train_hybrid.tm.fit_steps(1500, 20, 2.0, 80) == 800  # 100 ms a step
    assert train_hybrid.tm.fit_steps(1500, 20, 200.0, 80) == 21  # never fewer than the steps taken
