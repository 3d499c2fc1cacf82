"""`silu_mul`: SwiGLU's silu(gate) * up over the fused gate/up projection's output, in one launch.

Dispatch: the Triton kernel when `use_triton(gate_up)`, else the reference (tests/kernels/test_silu_mul.py
compares them).
"""
import torch

from specdraft.kernels import use_triton
from specdraft.kernels.silu_mul.reference import silu_mul_reference


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [..., 2I] = [gate | up] -> silu(gate) * up [..., I] in gate_up's dtype."""
    if use_triton(gate_up):
        from specdraft.kernels.silu_mul.triton_kernel import silu_mul_triton

        return silu_mul_triton(gate_up)
    return silu_mul_reference(gate_up)


__all__ = ["silu_mul", "silu_mul_reference"]
