"""Soft cross-entropy, the spec: -sum_v softmax(target_logits)_v * log_softmax(draft_logits)_v per row."""
import torch


def soft_cross_entropy_reference(draft_logits: torch.Tensor, target_logits: torch.Tensor,
                                 row_weights: torch.Tensor) -> torch.Tensor:
    """draft_logits, target_logits [N, V]; row_weights [N] -> sum_n w_n * CE_n (a scalar, float32)."""
    target_probs = torch.softmax(target_logits.float(), dim=-1)  # [N, V]
    draft_logprobs = torch.log_softmax(draft_logits.float(), dim=-1)  # [N, V]
    return (-(target_probs * draft_logprobs).sum(-1) * row_weights.float()).sum()
