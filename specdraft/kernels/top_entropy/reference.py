"""The spec of a draft distribution's top-M entropy (what a tree scorer reads of a candidate's parent,
decoding/tree.py): each row's softmax restricted to its M most probable tokens, renormalised, and the entropy of
that distribution."""
import torch


def top_entropy_reference(logits: torch.Tensor, top: int) -> torch.Tensor:
    """logits [R, V] (any float dtype); top M >= 1 -> [R] float32 entropies (nats) over each row's top min(M, V)."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    top_logprobs = logprobs.topk(min(top, logprobs.shape[-1]), dim=-1).values  # [R, M]
    top_logprobs = top_logprobs - torch.logsumexp(top_logprobs, dim=-1, keepdim=True)
    return -(top_logprobs.exp() * top_logprobs).sum(-1)
