"""SwiGLU's activation, the spec: silu(gate) * up, silu rounded to the dtype before the product (two PyTorch ops)."""
import torch
import torch.nn.functional as F


def silu_mul_reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """gate, up [..., I] -> [..., I]."""
    return F.silu(gate) * up
