"""Which models a harness target (PERF_TARGET) serves: the directory the servers load and the scenario shape.

Usage (device-run.sh): python models_for_target.py PERF_TARGET MODELS WORK  -> prints the models directory:
  tiny                      MODELS (the trained tiny pair)
  qwen3-8b, qwen3-30b-a3b   WORK/shaped (make_shaped.py's configs, random weights)
  embedded-<shape>          WORK/embedded-<shape> (embed_models.py: the trained tiny pair inside <shape>'s weights)
scenario.SHAPES takes the embedded entries from embedded_shapes().
"""

import os
import sys

TINY_TARGET, TINY_DRAFTER = "tiny-qwen3", "tiny-qwen3-dflash"
TARGET_DIR = "target"  # embed_models.py's target directory inside WORK/embedded-<shape>
EMBED_SHAPES = ("qwen3-8b", "qwen3-30b-a3b")
RANDOM_SHAPES = EMBED_SHAPES  # make_shaped.py's shapes, served with random weights
EMBEDDED_PREFIX = "embedded-"
# A smaller KV pool than the tiny pair's, so that several production-shaped servers share one H200.
EMBEDDED_SERVER_FLAGS = ["--max-total-tokens", "32768"]


def embedded_shapes() -> dict[str, tuple[str, str, list[str], list[str]]]:
    """scenario.SHAPES entries (target dir, default drafter dir, server flags, speculative flags) for the
    embedded targets; PERF_DRAFTER picks another drafter level by its directory name."""
    return {
        EMBEDDED_PREFIX + shape: (TARGET_DIR, TINY_DRAFTER, list(EMBEDDED_SERVER_FLAGS), []) for shape in EMBED_SHAPES
    }


def embed_shape(target: str) -> str:
    """'embedded-qwen3-8b' -> 'qwen3-8b'; '' for a target that is not embedded."""
    return target[len(EMBEDDED_PREFIX) :] if target.startswith(EMBEDDED_PREFIX) else ""


def models_for_target(target: str, models: str, work: str) -> str:
    if target == "tiny":
        return models
    if target in RANDOM_SHAPES:
        return os.path.join(work, "shaped")
    if embed_shape(target) in EMBED_SHAPES:
        return os.path.join(work, target)
    raise ValueError(
        "unknown target %r (tiny, %s, %s)"
        % (target, ", ".join(RANDOM_SHAPES), ", ".join(EMBEDDED_PREFIX + s for s in EMBED_SHAPES))
    )


if __name__ == "__main__":
    print(models_for_target(*sys.argv[1:4]))
