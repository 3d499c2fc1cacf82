"""SwiGLU's activation, the spec: gate_up [..., 2I] = [gate | up] -> silu(gate) * up [..., I], silu rounded to the
dtype before the product (two PyTorch ops)."""
import torch
import torch.nn.functional as F


def silu_mul_reference(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [..., 2I] -> [..., I]."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
