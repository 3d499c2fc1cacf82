"""A mixture-of-experts layer's routed experts, the spec: row n's output is sum_j w[n, j] * expert_e(x_n) over its k
routed experts e = expert_ids[n, j], each expert a SiLU-gated MLP, down_e(silu(gate_e x) * up_e x). Ids outside
[0, E) route nowhere (they add nothing).

The loop runs every expert over every row and keeps the routed rows' results (masked, not gathered): static
shapes, no host synchronisation, so it runs in a CUDA graph too; a row's sum over its experts is taken in float32,
in expert order."""
import torch
import torch.nn.functional as F


def grouped_experts_reference(hidden: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
                              expert_ids: torch.Tensor, expert_weights: torch.Tensor) -> torch.Tensor:
    """hidden [N, H]; gate_up [E, 2I, H] (gate rows first); down [E, H, I]; expert_ids [N, k] int; expert_weights
    [N, k] -> [N, H] in hidden's dtype."""
    num_experts, inter_size = gate_up.shape[0], down.shape[2]
    out = torch.zeros(hidden.shape, device=hidden.device, dtype=torch.float32)  # [N, H]
    for expert in range(num_experts):
        routed = expert_ids == expert  # [N, k]
        weight = torch.where(routed, expert_weights.float(), 0.0).sum(1, keepdim=True)  # [N, 1]
        gate, up = F.linear(hidden, gate_up[expert]).split(inter_size, dim=-1)  # [N, I] each
        expert_out = F.linear(F.silu(gate) * up, down[expert]).float()  # [N, H]
        out += torch.where(routed.any(1, keepdim=True), weight * expert_out, 0.0)  # never 0 * inf
    return out.to(hidden.dtype)
