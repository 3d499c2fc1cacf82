"""Shared draft blocks: the memory-lean RMSNorm has autograd's forward and gradients. CPU."""
import torch

from specdraft.layers import RMSNorm
from specdraft.layers.blocks import _RMSNormFunction


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
