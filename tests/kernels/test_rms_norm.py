"""rms_norm: the Triton kernel (under TRITON_INTERPRET=1 on CPU) against the reference, with and without the
residual add, in both weight orders; the reference is Hugging Face Llama's RMSNorm and the draft heads' RMSNorm.

Half precision: the same bits. float32: within 2 ulp, as the float32 sum of squares is summed in another order
(PyTorch's vectorised sum and the kernel's tree give sums one ulp apart, which moves every element of the row);
the half-precision results round that away except where an element sits on a rounding boundary (rare: none in
these cases)."""
import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from specdraft.core.errors import SpecdraftError
from specdraft.kernels.rms_norm import rms_norm, rms_norm_reference
from specdraft.kernels.rms_norm.triton_kernel import rms_norm_triton
from specdraft.layers.blocks import RMSNorm

EPS = 1e-5


def _inputs(rows, hidden, dtype, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x, residual = (torch.randn(rows, hidden, generator=generator).mul(3).to(dtype) for _ in range(2))
    weight = (1 + torch.randn(hidden, generator=generator) / 4).to(dtype)
    return x, residual, weight


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows, hidden", [(1, 576), (5, 64), (3, 100)])
@pytest.mark.parametrize("weight_in_fp32", [False, True])
def test_triton_matches_reference(dtype, rows, hidden, weight_in_fp32):
    x, residual, weight = _inputs(rows, hidden, dtype)
    _assert_same(rms_norm_triton(x, weight, EPS, weight_in_fp32=weight_in_fp32),
                 rms_norm_reference(x, weight, EPS, weight_in_fp32=weight_in_fp32))
    out, summed = rms_norm_triton(x, weight, EPS, residual, weight_in_fp32)
    expected_out, expected_summed = rms_norm_reference(x, weight, EPS, residual, weight_in_fp32)
    assert torch.equal(summed, expected_summed) and torch.equal(summed, x + residual)
    _assert_same(out, expected_out)


def _assert_same(got, expected):
    if got.dtype == torch.float32:
        torch.testing.assert_close(got, expected, rtol=2.5e-7, atol=1e-7)
    else:
        assert torch.equal(got, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_is_hf_llama_and_draft_rmsnorm(dtype):
    x, _, weight = _inputs(4, 96, dtype)
    hf = LlamaRMSNorm(96, eps=EPS).to(dtype)
    draft = RMSNorm(96, EPS).to(dtype)
    with torch.no_grad():
        hf.weight.copy_(weight)
        draft.weight.copy_(weight)
        assert torch.equal(rms_norm_reference(x, weight, EPS), hf(x))
        assert torch.equal(rms_norm_reference(x, weight, EPS, weight_in_fp32=True), draft(x))


def test_leading_dims_strided_rows_and_dispatch(monkeypatch):
    buffer, _, weight = _inputs(6, 128, torch.bfloat16)
    x = buffer.view(2, 3, 128)[:, :, :64]  # rows with a stride of 128
    weight = weight[:64].contiguous()
    expected = rms_norm_reference(x, weight, EPS)
    assert torch.equal(rms_norm(x, weight, EPS), expected)
    monkeypatch.setenv("SPECDRAFT_KERNELS", "reference")
    assert torch.equal(rms_norm(x, weight, EPS), expected)


def test_bad_inputs_are_named():
    x, residual, weight = _inputs(2, 32, torch.bfloat16)
    with pytest.raises(SpecdraftError, match="weight"):
        rms_norm_triton(x, weight.float(), EPS)
    with pytest.raises(SpecdraftError, match="residual"):
        rms_norm_triton(x, weight, EPS, residual[:, :16])
