"""Soft cross-entropy in row chunks: float32 softmaxes exist for `chunk_rows` rows at a time, in the forward and
again (recomputed) in the backward, instead of [N, V] float32 tensors for the target and the draft."""
import torch


def _chunk_loss_and_grad(draft_chunk, target_chunk, weight_chunk, need_grad: bool):
    """[n, V] logits, [n] weights -> (weighted loss sum, d loss / d draft_logits [n, V] or None)."""
    target_probs = torch.softmax(target_chunk.float(), dim=-1)  # [n, V]
    draft_logprobs = torch.log_softmax(draft_chunk.float(), dim=-1)  # [n, V]
    weights = weight_chunk.float()
    loss = (-(target_probs * draft_logprobs).sum(-1) * weights).sum()
    if not need_grad:
        return loss, None
    # d/dz of -sum_v t_v log softmax(z)_v = softmax(z) - t (each row's target sums to one)
    return loss, (draft_logprobs.exp_() - target_probs) * weights[:, None]


class ChunkedSoftCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, draft_logits, target_logits, row_weights, chunk_rows: int):
        total = torch.zeros((), device=draft_logits.device, dtype=torch.float32)
        for start in range(0, draft_logits.shape[0], chunk_rows):
            rows = slice(start, start + chunk_rows)
            total += _chunk_loss_and_grad(draft_logits[rows], target_logits[rows], row_weights[rows], False)[0]
        ctx.save_for_backward(draft_logits, target_logits, row_weights)
        ctx.chunk_rows = chunk_rows
        return total

    @staticmethod
    def backward(ctx, grad_total):
        draft_logits, target_logits, row_weights = ctx.saved_tensors
        grad_draft = torch.empty_like(draft_logits)
        for start in range(0, draft_logits.shape[0], ctx.chunk_rows):
            rows = slice(start, start + ctx.chunk_rows)
            _, grad = _chunk_loss_and_grad(draft_logits[rows], target_logits[rows], row_weights[rows], True)
            grad_draft[rows] = (grad * grad_total).to(grad_draft.dtype)
        return grad_draft, None, None, None
