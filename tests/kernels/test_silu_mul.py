"""silu_mul: the Triton kernel (under TRITON_INTERPRET=1 on CPU) against the reference: within an ulp of the
float32 silu in float32 (exp differs between libraries), the same bits in bfloat16 and float16 here."""
import pytest
import torch

from specdraft.core.errors import SpecdraftError
from specdraft.kernels.silu_mul import silu_mul, silu_mul_reference
from specdraft.kernels.silu_mul.triton_kernel import silu_mul_triton


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(1, 2 * 1536), (5, 2 * 100), (2, 3, 64)])
def test_triton_matches_reference(dtype, shape):
    gate_up = torch.randn(shape, generator=torch.Generator().manual_seed(0)).mul(3).to(dtype)
    halves = gate_up.chunk(2, dim=-1)  # strided views, as a fused gate/up projection gives
    got, expected = silu_mul_triton(*halves), silu_mul_reference(*halves)
    assert got.shape == expected.shape == (*shape[:-1], shape[-1] // 2)
    if dtype == torch.float32:
        torch.testing.assert_close(got, expected, rtol=3e-7, atol=1e-7)
    else:
        assert torch.equal(got, expected)


def test_dispatch_and_bad_input(monkeypatch):
    gate, up = torch.randn(2, 3, 40).bfloat16()
    assert torch.equal(silu_mul(gate, up), silu_mul_reference(gate, up))
    monkeypatch.setenv("SPECDRAFT_KERNELS", "reference")
    assert torch.equal(silu_mul(gate, up), silu_mul_reference(gate, up))
    with pytest.raises(SpecdraftError, match="one shape"):
        silu_mul_triton(gate, up[:, :39])
