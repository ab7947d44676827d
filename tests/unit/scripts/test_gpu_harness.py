"""The GPU harness's host-side pieces: the scoreboard's rows and the random shapes' server flags."""

import os
import sys

import pytest

HARNESS = os.path.join(os.path.dirname(__file__), "..", "..", "gpu_sglang")
sys.path.insert(0, HARNESS)

import scenario  # noqa: E402
import scoreboard  # noqa: E402


def perf_doc(dflash, ddtree, gpu=None):
    """A perf.py result with one DDTREE server: tokens/s per round at concurrency 1."""
    runs = []
    for server, values in (("perf-dflash", dflash), ("perf-ddtree", ddtree)):
        for i, value in enumerate(values):
            runs.append({"server": server, "concurrency": 1, "round": i, "tokens_per_s": value, "mean_accept": 1.0})
    doc = {
        "target": "qwen3-30b-a3b",
        "new_tokens": 64,
        "servers": {"perf-ddtree": {"algorithm": "DDTREE", "flags": ["--speculative-ddtree-budget", "15"]}},
        "runs": runs,
    }
    if gpu:
        doc["gpu"] = gpu
    return doc


def test_scoreboard_leaves_the_warm_up_round_out_of_the_medians():
    (row,) = scoreboard.rows_from_perf(perf_doc([50.0, 100.0, 100.0], [90.0, 80.0, 82.0]), "abc", "src.json")
    assert row["per_round"] == [1.8, 0.8, 0.82]
    assert row["ddtree_over_dflash"] == 0.81
    assert row["tokens_per_s"]["DFLASH"] == 100.0
    assert row["tokens_per_s"]["DDTREE"] == 81.0
    assert row["warm_up_round"] == "excluded"
    assert (row["shape"], row["layers"], row["ddtree_setting"]) == ("Qwen3-Coder-30B-A3B (random weights)", 48, "15")


def test_scoreboard_keeps_a_single_round():
    (row,) = scoreboard.rows_from_perf(perf_doc([100.0], [80.0]), "abc", "src.json")
    assert row["ddtree_over_dflash"] == 0.8
    assert row["warm_up_round"] == "none"


@pytest.mark.parametrize(
    "doc_gpu, option, expected",
    [
        ("NVIDIA H100 80GB HBM3", None, "NVIDIA H100 80GB HBM3"),
        (None, "NVIDIA H200", "NVIDIA H200"),
        (None, None, None),
    ],
)
def test_scoreboard_rows_name_the_gpu(doc_gpu, option, expected):
    (row,) = scoreboard.rows_from_perf(perf_doc([1.0], [1.0], gpu=doc_gpu), "abc", "src.json", gpu=option)
    assert row["gpu"] == expected


@pytest.mark.parametrize("shape", ["qwen3-8b", "qwen3-30b-a3b"])
@pytest.mark.parametrize("algorithm", ["DFLASH", "DDTREE"])
def test_random_shapes_load_the_drafters_own_weights(shape, algorithm):
    """The target loads dummy weights; without its own load format the drafter would too (SGLang's draft load
    format follows --load-format), and its seeded weights would never be read."""
    server = scenario.flags("/models", 30000, shape=shape)
    spec = scenario.spec_flags("/models", algorithm, shape=shape)
    assert server[server.index("--load-format") + 1] == "dummy"
    assert spec[spec.index("--speculative-draft-load-format") + 1] == "safetensors"


def test_the_trained_pair_loads_as_it_is_saved():
    assert "--speculative-draft-load-format" not in scenario.spec_flags("/models", "DFLASH", shape="tiny")
    assert "--load-format" not in scenario.flags("/models", 30000, shape="tiny")
