"""`silu_mul`: SwiGLU's silu(gate) * up in one launch (gate and up: two tensors, or the halves of one fused
gate/up projection).

Dispatch: the Triton kernel when `use_triton(gate_up)`, else the reference (tests/kernels/test_silu_mul.py
compares them).
"""
import torch

from specdraft.kernels import use_triton
from specdraft.kernels.silu_mul.reference import silu_mul_reference


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """gate, up [..., I] (any row strides, contiguous last dim) -> silu(gate) * up [..., I] in their dtype."""
    if use_triton(gate, "silu_mul"):
        from specdraft.kernels.silu_mul.triton_kernel import silu_mul_triton

        return silu_mul_triton(gate, up)
    return silu_mul_reference(gate, up)


__all__ = ["silu_mul", "silu_mul_reference"]
