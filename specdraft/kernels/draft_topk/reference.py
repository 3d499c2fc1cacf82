"""Draft top-k, the spec: the k largest log-softmax values of each row (ties: lower draft index first), and the
target-vocabulary ids of those draft tokens (target id = draft index + d2t[draft index]).

A row whose log-softmax has no finite normaliser (a NaN or +inf logit, or every logit -inf: a broken draft) is
untrusted: its k scores are -inf (children no tree selects or accepts: padding) and its ids those of draft indices
0..k-1, so that a broken draft costs acceptance and names no token by its garbage."""
import torch


def draft_topk_reference(draft_logits: torch.Tensor, d2t: torch.Tensor, k: int):
    """draft_logits [N, Vd]; d2t [Vd] int64 -> (topk_logprobs [N, k] float32, topk_target_ids [N, k] int64)."""
    logits = draft_logits.float()  # [N, Vd]
    draft_logprobs = torch.log_softmax(logits, dim=-1)  # [N, Vd]
    draft_ids = torch.sort(logits, dim=-1, descending=True, stable=True).indices[:, :k]  # [N, k]
    scores = draft_logprobs.gather(-1, draft_ids)  # [N, k]
    trusted = torch.isfinite(scores[:, :1])  # [N, 1] the top-1 log-probability is finite iff the normaliser is
    draft_ids = torch.where(trusted, draft_ids, torch.arange(k, device=draft_ids.device))
    return torch.where(trusted, scores, float("-inf")), draft_ids + d2t[draft_ids]
