"""Draft top-k, the spec: the k largest log-softmax values of each row (ties: lower draft index first), and the
target-vocabulary ids of those draft tokens (target id = draft index + d2t[draft index])."""
import torch


def draft_topk_reference(draft_logits: torch.Tensor, d2t: torch.Tensor, k: int):
    """draft_logits [N, Vd]; d2t [Vd] int64 -> (topk_logprobs [N, k] float32, topk_target_ids [N, k] int64)."""
    logits = draft_logits.float()  # [N, Vd]
    draft_logprobs = torch.log_softmax(logits, dim=-1)  # [N, Vd]
    draft_ids = torch.sort(logits, dim=-1, descending=True, stable=True).indices[:, :k]  # [N, k]
    return draft_logprobs.gather(-1, draft_ids), draft_ids + d2t[draft_ids]
