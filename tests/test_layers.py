"""Shared draft blocks: the memory-lean RMSNorm and SwiGLU have autograd's forward and gradients. CPU."""
import pytest
import torch

from specdraft.layers import RMSNorm, SwiGLU
from specdraft.layers.blocks import _RMSNormFunction, _SwiGLUDownFunction, swiglu


def _autograd_rms_norm(x, weight, eps):
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


def test_rms_norm_gradients_match_autograd():
    norm = RMSNorm(8, 1e-5).double()
    with torch.no_grad():
        norm.weight.copy_(torch.randn(8))
    x = torch.randn(3, 5, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, w: _RMSNormFunction.apply(a, w, 1e-5), (x, norm.weight))
    norm, x = norm.float(), x.detach().float().requires_grad_()
    out_grad = torch.randn(3, 5, 8)
    expected = torch.autograd.grad(_autograd_rms_norm(x, norm.weight, 1e-5), [x, norm.weight], out_grad)
    actual = torch.autograd.grad(norm(x), [x, norm.weight], out_grad)
    for got, want in zip(actual, expected):
        torch.testing.assert_close(got, want)


def test_rms_norm_keeps_the_input_dtype():
    norm = RMSNorm(16, 1e-6)
    x = torch.randn(4, 16).bfloat16().requires_grad_()
    out = norm(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, _autograd_rms_norm(x, norm.weight, 1e-6))
    out.sum().backward()
    assert x.grad.dtype == torch.bfloat16 and norm.weight.grad.dtype == torch.float32


def _swiglu(mlp, x, recompute_pointwise):  # the functional SwiGLU on the module's weights
    gate_up = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])
    return swiglu(x, gate_up, mlp.down_proj.weight, recompute_pointwise=recompute_pointwise)


def _swiglu_grads(mlp, x, out_grad, recompute_pointwise, autocast):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = _swiglu(mlp, x, recompute_pointwise)
    params = [x, *mlp.parameters()]
    return out, torch.autograd.grad(out, params, out_grad.to(out.dtype))


@pytest.mark.parametrize("autocast", [False, True])
def test_swiglu_recomputing_pointwise_matches_autograd(autocast):
    """The SwiGLU that keeps only gate and up (silu and the product recomputed in the backward) gives plain
    autograd's output and gradients, in float32 and under bf16 autocast (float32 weights)."""
    torch.manual_seed(0)
    mlp = SwiGLU(8, 24)
    x = torch.randn(2, 5, 8, requires_grad=True)
    out_grad = torch.randn(2, 5, 8)
    plain_out, plain_grads = _swiglu_grads(mlp, x, out_grad, False, autocast)
    if not autocast:  # the functional SwiGLU (one gate/up matmul) is the module's
        torch.testing.assert_close(plain_out, mlp(x))
    lean_out, lean_grads = _swiglu_grads(mlp, x, out_grad, True, autocast)
    assert lean_out.dtype == plain_out.dtype == (torch.bfloat16 if autocast else torch.float32)
    torch.testing.assert_close(lean_out, plain_out, rtol=0, atol=0)
    tolerance = {"rtol": 1e-2, "atol": 1e-3} if autocast else {}
    for lean, plain in zip(lean_grads, plain_grads):
        assert lean.dtype == plain.dtype
        torch.testing.assert_close(lean, plain, **tolerance)


def test_swiglu_recomputing_pointwise_keeps_two_intermediate_tensors():
    """Saved for the backward: x, the gate and up projections and the weights; not silu(gate) nor the product."""
    mlp = SwiGLU(8, 24)
    x = torch.randn(3, 8, requires_grad=True)
    for lean, expected in ((False, 4), (True, 2)):
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            _swiglu(mlp, x, lean)
        assert sum(1 for t in saved if t.shape == (3, 24)) == expected


def test_swiglu_gradcheck():
    gate = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    up = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(_SwiGLUDownFunction.apply, (gate, up, weight))
