"""`rms_norm`: (residual add +) RMSNorm in one launch, Hugging Face Llama's rounding (or the draft heads', with
the weight product in float32).

Dispatch: the Triton kernel when `use_triton(x)`, else the reference (tests/kernels/test_rms_norm.py checks that
both give the same bits).
"""

import torch

from specdraft.kernels import use_triton
from specdraft.kernels.rms_norm.reference import rms_norm_reference


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
             weight_in_fp32: bool = False):
    """x [..., H]; weight [H]; residual [..., H] or None -> normed [..., H] in x's dtype, or (normed, x + residual)
    when a residual is given (the sum is the next residual). weight_in_fp32: multiply by the weight in float32
    before the cast (the draft heads' RMSNorm) instead of after it (HF Llama)."""
    if use_triton(x, "rms_norm"):
        from specdraft.kernels.rms_norm.triton_kernel import rms_norm_triton

        return rms_norm_triton(x, weight, eps, residual, weight_in_fp32)
    return rms_norm_reference(x, weight, eps, residual, weight_in_fp32)


__all__ = ["rms_norm", "rms_norm_reference"]
