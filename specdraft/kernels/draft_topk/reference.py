"""Draft top-k, the spec: log-softmax over the draft vocabulary, the k best, mapped to target ids."""
import torch


def draft_topk_reference(draft_logits: torch.Tensor, d2t: torch.Tensor, k: int):
    """draft_logits [N, Vd]; d2t [Vd] -> (topk_logprobs [N, k] float32, topk_target_ids [N, k] int64)."""
    logprobs = torch.log_softmax(draft_logits.float(), dim=-1)  # [N, Vd]
    topk_logprobs, draft_ids = torch.topk(logprobs, k, dim=-1)  # [N, k]
    return topk_logprobs, draft_ids + d2t[draft_ids]
