"""Models carried between device calls (tests/gpu_sglang/carry_models.py): snapped once, packed, and unpacked
to the very tensors trained on; the levels a later call keeps and the ones it trains on."""

import json
import shutil

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from .test_embed_models import load_harness  # noqa: E402

carry = load_harness("carry_models")


def test_a_snapped_tensor_is_its_own_snap_and_close_to_the_original():
    g = torch.Generator().manual_seed(0)
    for w in (torch.randn(96, 40, generator=g) * 0.02, torch.randn(8, 3, generator=g) * 30, torch.zeros(4, 4)):
        snapped = carry.snap_tensor(w)
        assert snapped.dtype == torch.bfloat16 and torch.equal(carry.snap_tensor(snapped), snapped)
        assert (snapped.float() - w).abs().max() <= w.abs().amax(dim=1).max() / 127 + 1e-30
    vector = torch.randn(40, generator=g)
    assert torch.equal(carry.snap_tensor(vector), vector.to(torch.bfloat16))


def test_packing_halves_the_matrices_and_unpacks_bit_for_bit():
    g = torch.Generator().manual_seed(1)
    state = carry.snap_state({"w": torch.randn(64, 32, generator=g), "norm": torch.randn(32, generator=g)})
    packed = carry.pack_state(state)
    assert packed["w"].dtype == torch.int8 and packed["w" + carry.SCALE_SUFFIX].shape == (64, 1)
    unpacked = carry.unpack_state(packed)
    assert set(unpacked) == set(state) and all(torch.equal(unpacked[k], state[k]) for k in state)


def test_an_unsnapped_model_does_not_survive_packing():
    w = torch.randn(16, 16, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    assert not torch.equal(carry.unpack_state(carry.pack_state({"w": w}))["w"], w)  # hence the snap at training


def test_a_models_directory_round_trips_and_leaves_unreached_levels_behind(tiny_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    models = tmp_path / "models"
    for name in ("tiny-qwen3", "tiny-qwen3-dflash"):
        shutil.copytree(tiny_dir / name, models / name)
        for f in (models / name).glob("*.safetensors"):
            save_file(carry.snap_state(load_file(f)), f)
    shutil.copytree(models / "tiny-qwen3-dflash", models / "level-high")
    levels = [{"name": "tiny-qwen3-dflash", "reached": True}, {"name": "level-high", "reached": False}]
    (models / "train-levels.json").write_text(json.dumps({"levels": levels}))
    archive = tmp_path / "models.carry.tar.xz"
    manifest = carry.pack(str(models), str(archive))
    assert sorted(manifest["models"]) == ["tiny-qwen3", "tiny-qwen3-dflash"]
    out = tmp_path / "out"
    assert carry.unpack(str(archive), str(out)) == ["tiny-qwen3", "tiny-qwen3-dflash"]
    for name in ("tiny-qwen3", "tiny-qwen3-dflash"):
        want = {k: v for f in (models / name).glob("*.safetensors") for k, v in load_file(f).items()}
        got = load_file(out / name / "model.safetensors")
        assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want), name
        assert (out / name / "config.json").read_bytes() == (models / name / "config.json").read_bytes()
    assert json.loads((out / "train-levels.json").read_text())["levels"] == levels


def test_a_later_run_keeps_the_carried_levels_it_reached_and_trains_the_rest(tmp_path):
    tm = load_harness("train_models")
    for name in ("low", "mid", "high"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text("{}")
    levels = [{"name": "low", "reached": True}, {"name": "mid", "reached": False}]
    (tmp_path / "train-levels.json").write_text(json.dumps({"levels": levels, "carried": ["high"]}))
    saver = tm.LevelSaver(str(tmp_path), [("low", 3.0), ("mid", 6.0), ("high", 9.0)], print)
    assert saver.carried == ["low", "high"] and saver.pending == [("mid", 6.0)]
