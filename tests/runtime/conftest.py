"""Runtime tests run the kernels' PyTorch references on the CPU (the Triton interpreter is far too slow for whole
generations); tests/kernels compares each Triton kernel with its reference, and test_engine has one short
generation through the interpreted kernels."""
import pytest
import torch


@pytest.fixture(autouse=True)
def _reference_kernels_on_cpu(request, monkeypatch):
    if not torch.cuda.is_available() and "triton_kernels" not in request.keywords:
        monkeypatch.setenv("SPECDRAFT_KERNELS", "reference")
