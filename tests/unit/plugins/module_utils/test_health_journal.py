"""The health gate's journal rules on real-looking SGLang 0.5.23 journals."""

import pytest
from health_samples import (
    AMBIGUOUS,
    BAD_FLAG,
    GOOD_START,
    OOM_KILL,
    PLUGIN_FAILURE,
    SCHEDULER_CRASH,
    SITE,
    UNKNOWN_ALGORITHM,
)

from ansible_collections.ddtree.sglang.plugins.module_utils import health_journal
from ansible_collections.ddtree.sglang.plugins.module_utils.health_journal import (
    exception_summary,
    match_signatures,
    split_journal_output,
)

# ---- journal parsing --------------------------------------------------------------------------------


def test_split_journal_output_takes_the_cursor_and_drops_notices():
    out = "-- No entries --\nline one\n  indented\n-- cursor: s=8a1;i=2f;b=77;m=1c;t=5f;x=9\n"
    assert split_journal_output(out) == (["line one", "  indented"], "s=8a1;i=2f;b=77;m=1c;t=5f;x=9")
    assert split_journal_output("") == ([], None)


# ---- signatures ----------------------------------------------------------------------------------


def test_good_start_has_no_fatal_signature_and_every_progress_marker():
    assert match_signatures(GOOD_START) == []
    markers = [health_journal.match_progress(line) for line in GOOD_START]
    assert [m for m in markers if m] == [
        "load_weight_begin",
        "load_weight_end",
        "load_weight_begin",
        "load_weight_end",
        "memory_pool_end",
        "cuda_graph_begin",
        "cuda_graph_end",
        "scheduler_ready",
        "application_started",
        "uvicorn_running",
        "fired_up",
    ]


@pytest.mark.parametrize(
    "lines, kinds",
    [
        (BAD_FLAG, ["bad_flag"]),
        (AMBIGUOUS, ["bad_flag"]),
        (SCHEDULER_CRASH, ["scheduler_exception", "self_kill"]),
        (UNKNOWN_ALGORITHM, ["traceback", "unknown_algorithm", "unknown_algorithm"]),  # the source line and the error
        (PLUGIN_FAILURE, ["plugin", "traceback", "traceback", "unknown_algorithm", "unknown_algorithm"]),
        (OOM_KILL, []),
        (["ImportError: %s/sgl_kernel/common_ops.abi3.so: undefined symbol: _ZN3c104cuda9SetDeviceEi" % SITE], ["abi"]),
        (["RuntimeError: Could not load any common_ops library from %s/sgl_kernel" % SITE], ["abi"]),
        (
            ["RuntimeError: Could not load libtorchcodec. Likely causes: FFmpeg is not properly installed"],
            ["torchcodec"],
        ),
        (["torch.AcceleratorError: CUDA error: no kernel image is available for execution on the device"], ["arch"]),
        (
            [
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 94.97 GiB"
            ],
            ["cuda_oom"],
        ),
        (
            ["[2026-11-30 11:00:00] SIGQUIT received. signum=None, frame=None. It usually means one child failed."],
            ["self_kill"],
        ),
    ],
)
def test_signatures_on_real_lines(lines, kinds):
    assert [m["kind"] for m in match_signatures(lines)] == kinds


def test_extra_signatures_and_start_index():
    lines = ["all good", "NCCL WARN Cuda failure 'out of memory'", "Traceback (most recent call last):"]
    found = match_signatures(lines, extra=["NCCL WARN"], start=1)
    assert [(m["index"], m["kind"]) for m in found] == [(1, "custom"), (2, "traceback")]


def test_exception_summary_names_the_error_not_the_traceback():
    assert (
        exception_summary(SCHEDULER_CRASH)
        == "RuntimeError: DDTree verify: tree mask has 64 columns, the draft block has 16"
    )
    assert exception_summary(UNKNOWN_ALGORITHM) == "ValueError: Unknown speculative algorithm name: DDTREE"
    assert exception_summary(GOOD_START) is None
    assert exception_summary(PLUGIN_FAILURE) == "ModuleNotFoundError: No module named 'sglang_overlay.adapter'"
    assert exception_summary(PLUGIN_FAILURE, start=7) == "ValueError: Unknown speculative algorithm name: DDTREE"


def test_signature_evidence_carries_the_traceback():
    evidence = health_journal.signature_evidence(SCHEDULER_CRASH, match_signatures(SCHEDULER_CRASH))
    assert evidence[0]["kind"] == "scheduler_exception"
    assert any(line.startswith("RuntimeError: DDTree verify") for line in evidence[0]["context"])
