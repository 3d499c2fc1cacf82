"""Small, pure building blocks (Llama conventions), shared by every draft head."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class _RMSNormFunction(torch.autograd.Function):
    """(x * rsqrt(mean(x^2) + eps) * weight) in float32, cast to x's dtype. Keeps x and the [..., 1] rsqrt for
    the backward, where autograd would keep three float32 copies of x."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        normed, rstd = _rms_norm(x, weight, eps)
        ctx.save_for_backward(x, weight, rstd)
        return normed

    @staticmethod
    def backward(ctx, grad_out):
        x, weight, rstd = ctx.saved_tensors
        normed = x.to(rstd.dtype) * rstd  # [..., H]
        grad_normed = grad_out.to(rstd.dtype) * weight.to(rstd.dtype)
        grad_x = rstd * (grad_normed - normed * (grad_normed * normed).mean(-1, keepdim=True))
        grad_weight = (grad_out.to(rstd.dtype) * normed).flatten(0, -2).sum(0)
        return grad_x.to(x.dtype), grad_weight.to(weight.dtype), None


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., H] -> [..., H]
        # Under torch.compile, plain ops: Inductor chooses what to keep itself, and Dynamo's trace of the Function
        # gave a zero weight gradient on CUDA in float32 (torch 2.11; tests/test_train_perf.py's GPU test).
        if torch.compiler.is_compiling():
            return _rms_norm(x, self.weight, self.eps)[0]
        return _RMSNormFunction.apply(x, self.weight, self.eps)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., H], weight [H] -> (normed [..., H] in x's dtype, rstd [..., 1] in float32 or wider); plain
    differentiable ops, the Function's forward and the compiled path."""
    x32 = x.to(rstd_dtype := torch.promote_types(x.dtype, torch.float32))
    rstd = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)  # [..., 1]
    return (x32 * rstd * weight.to(rstd_dtype)).to(x.dtype), rstd


class _SwiGLUDownFunction(torch.autograd.Function):
    """down_proj(silu(gate) * up), keeping only gate and up for the backward: silu(gate) and the product (two
    more [..., I] tensors that plain autograd keeps, for the product's and down_proj's gradients) are
    recomputed there, a few pointwise ops and no matmul. Computes in gate's dtype (autocast's, when the
    projections ran under it) with the same ops as plain autograd, so gradients match it exactly."""

    @staticmethod
    def forward(ctx, gate, up, down_weight):
        ctx.save_for_backward(gate, up, down_weight)
        return F.linear(F.silu(gate) * up, down_weight.to(gate.dtype))

    @staticmethod
    def backward(ctx, grad_out):
        gate, up, down_weight = ctx.saved_tensors
        grad_out = grad_out.to(gate.dtype)
        silu_gate = F.silu(gate)  # [..., I]
        grad_product = grad_out @ down_weight.to(gate.dtype)  # [..., I]
        grad_weight = grad_out.flatten(0, -2).T @ (silu_gate * up).flatten(0, -2)  # [H, I]
        grad_gate = torch.ops.aten.silu_backward(grad_product * up, gate)
        return grad_gate, grad_product * silu_gate, grad_weight.to(down_weight.dtype)


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., H] -> [..., H]
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def swiglu(x: torch.Tensor, gate_up_weight: torch.Tensor, down_weight: torch.Tensor,
           recompute_pointwise: bool = False) -> torch.Tensor:
    """SwiGLU.forward from weights: gate_up_weight [2I, H] (gate's rows, then up's), down_weight [H, I].
    x [..., H] -> [..., H]; gate and up come from one matmul."""
    gate, up = F.linear(x, gate_up_weight).chunk(2, dim=-1)  # [..., I] each
    if recompute_pointwise and torch.is_grad_enabled():
        return _SwiGLUDownFunction.apply(gate, up, down_weight)
    return F.linear(F.silu(gate) * up, down_weight)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """positions [T] or [B, T] -> cos, sin [.., T, D] (Llama's half-rotation layout)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=positions.device).float() / head_dim)
    angles = positions.float()[..., None] * inv_freq  # [.., T, D/2]
    angles = torch.cat([angles, angles], dim=-1)  # [.., T, D]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, heads, T, D]; cos/sin [T, D] or [B, T, D]."""
    if cos.dim() == 3:
        cos, sin = cos[:, None], sin[:, None]
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """[B, kv_heads, T, D] -> [B, kv_heads * groups, T, D]."""
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)
