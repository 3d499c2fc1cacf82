"""`grouped_experts`: a mixture-of-experts layer's routed experts (Qwen3-MoE, Mixtral: SiLU-gated MLPs), every row
through the k experts its router picked, weighted and summed: a decode step's one row or a verify's tree nodes.

Dispatch: the Triton kernels when `use_triton(hidden)`, else the reference (tests/kernels/test_grouped_experts.py
checks that both compute the same function). Both are CUDA-graph capturable: static shapes, no host sync, the
routing read on the device, so a replay routes its rows anew.
"""
import torch

from specdraft.kernels import use_triton
from specdraft.kernels.grouped_experts.reference import grouped_experts_reference


def grouped_experts(hidden: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, expert_ids: torch.Tensor,
                    expert_weights: torch.Tensor) -> torch.Tensor:
    """hidden [N, H] rows; gate_up [E, 2I, H] each expert's fused gate (first I rows) and up (next I rows)
    projection; down [E, H, I]; expert_ids [N, k] int64 or int32 (a router's top k: distinct within a row; an id
    repeated adds each of its slots, ids outside [0, E) add nothing); expert_weights [N, k] the routing weights (normalised as the family wants), float32 or hidden's dtype
    -> [N, H] in hidden's dtype: sum_j w[n, j] * down_e(silu(gate_e x_n) * up_e x_n), e = expert_ids[n, j], the
    sum in float32."""
    if use_triton(hidden, "grouped_experts"):
        from specdraft.kernels.grouped_experts.triton_kernel import grouped_experts_triton

        return grouped_experts_triton(hidden, gate_up, down, expert_ids, expert_weights)
    return grouped_experts_reference(hidden, gate_up, down, expert_ids, expert_weights)


__all__ = ["grouped_experts", "grouped_experts_reference"]
