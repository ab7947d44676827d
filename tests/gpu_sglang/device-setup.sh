#!/usr/bin/env bash
# Sourced on the device by device-run.sh: install the carry set (.cache/gpu-sglang) the way the recipe in
# README.md says, and the overlay as a release installs it (its wheel, entry point included, onto a site
# directory that goes on PYTHONPATH; plugins/modules/release.py does the same pip call).
C=$REPO/.cache/gpu-sglang
SGLANG_SITE=/tmp/site
pip_t() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check --target "$@"; }
if [ "${SETUP_DONE:-0}" != 1 ]; then
pip_t "$SGLANG_SITE" "$C"/wheels/*.whl || return 1
tar xzf "$C/flashinfer-headers.tgz" -C "$SGLANG_SITE"
# Shims (README.md says why); none touches the speculative path (spec_info, the DFlash worker, the overlay).
cp "$REPO/tests/gpu_sglang/shims/cutedsl_dual_gemm.py" "$SGLANG_SITE/sglang/kernels/ops/gemm/cutedsl_dual_gemm.py"
cp "$REPO/tests/gpu_sglang/shims/renorm.py" "$SGLANG_SITE/sglang/kernels/ops/sampling/renorm.py"
# Releases: the overlay wheel, and the control wheel (planted lossy walk), each in its own site dir.
pip_t /tmp/release/site "$C"/overlay/ddtree_sglang_overlay-*.whl || return 1
pip_t /tmp/release-control/site "$C"/control/ddtree_sglang_overlay-*.whl || return 1
# A stack for spec_verify: the image's python (its venv holds torch 2.11 cu130) made to see /tmp/site
# through a .pth (as a stack's site-packages would hold sglang), behind /tmp/stack/bin/python.
echo "$SGLANG_SITE" > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/sglang-carry.pth"
mkdir -p /tmp/stack/bin
printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v python3)" > /tmp/stack/bin/python; chmod +x /tmp/stack/bin/python
fi
export SGLANG_SITE OVERLAY_RELEASE=/tmp/release/site OVERLAY_CONTROL=/tmp/release-control/site
export SGLANG_IS_FLASHINFER_AVAILABLE=false NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONNOUSERSITE=1
