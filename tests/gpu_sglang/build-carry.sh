#!/usr/bin/env bash
# Build the carry set for the device runs into .cache/gpu-sglang/ (ignored by git), from PyPI:
#   wheels/    sglang 0.5.23 (trimmed), sglang-kernel 0.4.5 (sm90 common ops only), the small wheels
#              of device-wheels.txt, ansible-core (module_utils for spec_verify on the device)
#   flashinfer-headers.tgz   FlashInfer 0.7.2's include/ as an importable stand-in package
#   overlay/   the overlay's release wheel, built from sglang_overlay/ (entry point included)
#   control/   the same wheel with a planted lossy walk (control for the chi-square test)
# Why each piece is what it is: README.md beside this script. Usage: tests/gpu_sglang/build-carry.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd); repo=$(cd "$here/../.." && pwd)
D=$repo/.cache/gpu-sglang; rm -rf "$D/wheels" "$D/overlay" "$D/control" "$D/flashinfer-headers.tgz"
mkdir -p "$D/wheels" "$D/overlay" "$D/control"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
P=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_34_x86_64
   --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64
   --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any)
python3 -m pip download -q --no-deps "${P[@]}" -d "$T" sglang==0.5.23 sglang-kernel==0.4.5 flashinfer-python==0.7.2
python3 -m pip download -q --no-deps "${P[@]}" -d "$D/wheels" -r "$here/device-wheels.txt"
python3 -m pip download -q --no-deps "${P[@]}" -d "$D/wheels" ansible-core==2.21.5
python3 -m pip install -q wheel
mv "$D"/wheels/jedi-*.whl "$T/"
( cd "$T"
  # jedi (imported by IPython, which sglang.utils imports): without its bundled typeshed and Django stubs,
  # used for code completion only; 4.7 MB of the 64 MiB a device call carries
  python3 -m wheel unpack jedi-*.whl >/dev/null
  rm -rf jedi-*/jedi/third_party/typeshed jedi-*/jedi/third_party/django-stubs
  python3 -m wheel unpack sglang-0.5.23-*.whl >/dev/null
  python3 -m wheel unpack sglang_kernel-0.4.5-*.whl >/dev/null
  # sglang: the diffusion stack, its tests and the Rust servers are never imported by launch_server
  rm -rf sglang-0.5.23/sglang/multimodal_gen sglang-0.5.23/sglang/test \
         sglang-0.5.23/sglang/srt/rust_extensions/_{server,bench,grpc,multimodal}.*.so
  # sglang-kernel: the sm90 common ops only (FA3, FlashMLA, sm100 are not loaded on this path)
  rm -f sglang_kernel-0.4.5/sgl_kernel/{flash_ops,flashmla_ops,spatial_ops}.abi3.so \
        sglang_kernel-0.4.5/sgl_kernel/infllm_ops*.so sglang_kernel-0.4.5/sgl_kernel/sm100/common_ops.abi3.so
  # relabel 0.4.5 -> 0.4.10 (start-up version assertion; 0.4.10's Python API is a subset of 0.4.5's)
  sed -i 's/^Version: 0.4.5$/Version: 0.4.10/' sglang_kernel-0.4.5/sglang_kernel-0.4.5.dist-info/METADATA
  mv sglang_kernel-0.4.5/sglang_kernel-0.4.5.dist-info sglang_kernel-0.4.5/sglang_kernel-0.4.10.dist-info
  mkdir -p fi-headers && cd fi-headers && python3 -m zipfile -e ../flashinfer_python-0.7.2-py3-none-any.whl x >/dev/null
  mkdir -p flashinfer/data/{csrc,cutlass/include,cutlass/tools/util/include,spdlog/include}
  mv x/flashinfer/data/include flashinfer/data/ && echo '# headers only (device harness stand-in)' > flashinfer/__init__.py
  tar czf "$D/flashinfer-headers.tgz" flashinfer )
python3 -m wheel pack "$T/sglang-0.5.23" -d "$D/wheels" >/dev/null
python3 -m wheel pack "$T"/jedi-*/ -d "$D/wheels" >/dev/null
python3 -m wheel pack "$T/sglang_kernel-0.4.5" -d "$D/wheels" >/dev/null
# the overlay's release wheel, and the control: the same sources with the planted lossy walk
python3 -m pip wheel -q --no-deps -w "$D/overlay" "$repo/sglang_overlay"
cp -r "$repo/sglang_overlay" "$T/overlay-control"; rm -rf "$T/overlay-control/build" "$T/overlay-control"/src/*.egg-info
python3 "$here/plant_lossy_walk.py" "$T/overlay-control/src/sglang_overlay/adapter/worker.py"
python3 -m pip wheel -q --no-deps -w "$D/control" "$T/overlay-control"
find "$D/wheels" -name '*.whl' | wc -l; du -csh "$D" | tail -1
