"""Trained models small enough to carry from one device call to the next, and back exactly.

A device call sends at most 64 MiB (the working tree and the carry together), and the carry's wheels take
most of it: a real-text target (5.4 M parameters, 10.8 MB in bfloat16) and its drafter levels (3.6 MB each)
do not fit beside them. So a trained model is *snapped* once, right after training: every matrix rounded to
int8 with one power-of-two scale per row (``w = q * s``, ``s >= max|row| / 127``), every vector kept in
bfloat16.
From then on the snapped model is the model: the drafter trains on the snapped target's text, the levels
served are snapped, and the packed file (int8 + scales, half the bytes) unpacks to the same bfloat16
tensors bit for bit, on any machine (the arithmetic runs in float32 on the CPU).

    python carry_models.py pack MODELS OUT.tar.xz      # MODELS: a directory of model directories
    python carry_models.py unpack OUT.tar.xz MODELS

A model directory is an HF or SGLang layout: ``*.safetensors`` (packed) and small files (``config.json``,
the tokenizer; copied as they are). ``train-levels.json`` beside the models goes along too, and a drafter
level it marks unreached stays behind (it holds the last drafter's weights, which ``drafter-last`` carries;
left out, the next call trains it). The archive is xz-compressed.
"""

from __future__ import annotations

import io
import json
import os
import sys
import tarfile

import torch

PACKED = "model.packed.safetensors"
SCALE_SUFFIX = ".__row_scale"
MANIFEST = "carry.json"


def snap_tensor(w: torch.Tensor) -> torch.Tensor:
    """The bfloat16 tensor a packed ``w`` unpacks to: matrices through int8 with per-row scales."""
    q, scale = _quantize(w)
    return w.detach().to(torch.bfloat16).cpu() if q is None else _dequantize(q, scale)


def snap_state(state: dict) -> dict:
    """``snap_tensor`` of every tensor (names kept)."""
    return {k: snap_tensor(v) for k, v in state.items()}


def snap_module(module: torch.nn.Module) -> None:
    """Replace a module's weights by their snapped values, in place (its dtype and device kept)."""
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(snap_tensor(p).to(device=p.device, dtype=p.dtype))


def _quantize(w: torch.Tensor):
    """int8 rows and their scales: the power of two at or above ``max|row| / 127``, so ``q * s`` is exact in
    bfloat16 (|q| <= 127 fits its 8-bit significand) and snapping a snapped tensor changes nothing."""
    if w.dim() != 2:
        return None, None
    x = w.detach().float().cpu()
    peak = x.abs().amax(dim=1, keepdim=True)
    scale = torch.where(peak > 0, torch.exp2(torch.ceil(torch.log2(peak / 127.0))), torch.ones_like(peak))
    return torch.round(x / scale).clamp_(-127, 127).to(torch.int8), scale


def _dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (q.float() * scale).to(torch.bfloat16)


def pack_state(state: dict) -> dict:
    """The tensors a packed file holds: ``name`` int8 with ``name + SCALE_SUFFIX`` float32 for matrices,
    ``name`` bfloat16 for the rest."""
    out = {}
    for name, w in state.items():
        q, scale = _quantize(w)
        if q is None:
            out[name] = w.detach().to(torch.bfloat16).cpu().contiguous()
        else:
            out[name], out[name + SCALE_SUFFIX] = q.contiguous(), scale.contiguous()
    return out


def unpack_state(packed: dict) -> dict:
    """``pack_state``'s inverse on snapped values: every tensor bfloat16."""
    out = {}
    for name, t in packed.items():
        if name.endswith(SCALE_SUFFIX):
            continue
        scale = packed.get(name + SCALE_SUFFIX)
        out[name] = t if scale is None else _dequantize(t, scale)
    return out


def _model_dirs(models: str) -> list:
    try:
        with open(os.path.join(models, "train-levels.json")) as fh:
            unreached = {lv["name"] for lv in json.load(fh).get("levels", []) if not lv.get("reached", True)}
    except (OSError, ValueError):
        unreached = set()
    return sorted(
        d
        for d in os.listdir(models)
        if d not in unreached
        and os.path.isdir(os.path.join(models, d))
        and any(f.endswith(".safetensors") for f in os.listdir(os.path.join(models, d)))
    )


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime = len(data), 0
    tar.addfile(info, io.BytesIO(data))


def pack(models: str, out: str) -> dict:
    """Every model directory under ``models`` into one tar (packed weights, small files as they are)."""
    from safetensors.torch import load_file, save

    manifest = {"models": {}}
    with tarfile.open(out, "w:xz", preset=9) as tar:
        for name in _model_dirs(models):
            path = os.path.join(models, name)
            state, files = {}, []
            for f in sorted(os.listdir(path)):
                if f.endswith(".safetensors"):
                    state.update(load_file(os.path.join(path, f)))
                elif os.path.isfile(os.path.join(path, f)):
                    files.append(f)
                    with open(os.path.join(path, f), "rb") as fh:
                        _add_bytes(tar, "%s/%s" % (name, f), fh.read())
            _add_bytes(tar, "%s/%s" % (name, PACKED), save(pack_state(state)))
            manifest["models"][name] = {"tensors": len(state), "files": files}
        extra = os.path.join(models, "train-levels.json")
        if os.path.isfile(extra):
            with open(extra, "rb") as fh:
                _add_bytes(tar, "train-levels.json", fh.read())
        _add_bytes(tar, MANIFEST, json.dumps(manifest, indent=1).encode())
    return manifest


def unpack(archive: str, models: str) -> list:
    """``pack``'s archive into ``models``: each model directory with ``model.safetensors`` in bfloat16."""
    from safetensors.torch import load, save_file

    names = []
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            if not member.isfile() or member.name == MANIFEST:
                continue
            data = tar.extractfile(member).read()
            target = os.path.join(models, member.name)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            if os.path.basename(member.name) == PACKED:
                save_file(unpack_state(load(data)), os.path.join(os.path.dirname(target), "model.safetensors"))
                names.append(os.path.dirname(member.name))
            else:
                with open(target, "wb") as fh:
                    fh.write(data)
    return sorted(names)


def main(argv: list) -> int:
    if len(argv) != 3 or argv[0] not in ("pack", "unpack"):
        print(__doc__, file=sys.stderr)
        return 2
    if argv[0] == "pack":
        print(json.dumps(pack(argv[1], argv[2])))
    else:
        print(json.dumps(unpack(argv[1], argv[2])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
