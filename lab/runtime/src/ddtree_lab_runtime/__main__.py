"""``python -m ddtree_lab_runtime <flags of python -m sglang.launch_server>`` (lab only)."""

from .gpus import reexec_with_gpus

# First, before anything heavy: re-exec once (same PID) with LAB_NVIDIA_GPUS set, so the lab's
# nvidia-smi lists this process as holding its GPUs.
reexec_with_gpus()

from .launch import main  # noqa: E402

main()
