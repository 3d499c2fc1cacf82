"""(Residual add +) RMSNorm, the spec: Hugging Face Llama's `LlamaRMSNorm`, operation for operation.

    h = x + residual                          # in x's dtype (rounded once), when a residual is given
    normed = float32(h) * rsqrt(mean(float32(h)^2) + eps)
    out = weight * normed.to(h.dtype)         # HF Llama: cast first, then the weight in h's dtype
    out = (normed * float32(weight)).to(h.dtype)   # weight_in_fp32=True: the draft heads' RMSNorm (layers/blocks.py)
"""

import torch


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
                       weight_in_fp32: bool = False):
    """x [..., H]; weight [H]; residual [..., H] or None -> out [..., H], or (out, x + residual) with a residual."""
    summed = x if residual is None else x + residual  # [..., H]
    x32 = summed.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)  # [..., H] float32
    if weight_in_fp32:
        out = (normed * weight.float()).to(summed.dtype)
    else:
        out = weight * normed.to(summed.dtype)
    return out if residual is None else (out, summed)
