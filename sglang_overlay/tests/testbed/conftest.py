"""The trained tiny pair (docs/evidence/gpu-sglang/models.tgz), unpacked once for the test bed's tests."""

import tarfile
from pathlib import Path

import pytest

MODELS_TGZ = Path(__file__).resolve().parents[3] / "docs" / "evidence" / "gpu-sglang" / "models.tgz"


@pytest.fixture(scope="package")
def tiny_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny")
    with tarfile.open(MODELS_TGZ) as tar:
        tar.extractall(out, filter="data")
    return out / "models"
