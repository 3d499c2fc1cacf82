"""A tree scorer's pruning of one depth in one launch, one program per parent: its top-M entropy
(`top_entropy_row`), then the FFN over each of its k children (joint probability, that entropy, the depth; in the
extended set also the child's own probability, the parent's joint one and the child's rank) and the cut.
Replaces the entropy's launch and about ten pointwise and matmul launches per depth."""
import torch
import triton
import triton.language as tl

from specdraft.kernels.launch import next_power_of_2
from specdraft.kernels.prune_children.reference import ScorerWeights
from specdraft.kernels.top_entropy.triton_kernel import key_shift, row_warps, top_entropy_row


@triton.jit
def _prune_children_kernel(child_ptr, parent_ptr, logits_ptr, row_stride, vocab, top, depth, hidden_w_ptr,
                           hidden_b_ptr, out_w_ptr, out_b_ptr, cut_ptr, out_ptr, k, hidden,
                           BLOCK_V: tl.constexpr, KEY_SHIFT: tl.constexpr, BLOCK_K: tl.constexpr,
                           BLOCK_H: tl.constexpr, NUM_FEATURES: tl.constexpr):
    row = tl.program_id(0)
    entropy = top_entropy_row(logits_ptr + row.to(tl.int64) * row_stride, vocab, top, BLOCK_V, KEY_SHIFT)
    child = tl.arange(0, BLOCK_K)
    is_child = child < k
    logprobs = tl.load(child_ptr + row * k + child, mask=is_child, other=0.0).to(tl.float32)  # [BLOCK_K]
    parent = tl.load(parent_ptr + row).to(tl.float32)
    probability = tl.exp(parent + logprobs)
    unit = tl.arange(0, BLOCK_H)
    is_unit = unit < hidden
    row_w = hidden_w_ptr + unit * NUM_FEATURES  # [BLOCK_H] each unit's first-layer weights
    w_joint = tl.load(row_w, mask=is_unit, other=0.0)  # [BLOCK_H]
    w_entropy = tl.load(row_w + 1, mask=is_unit, other=0.0)
    w_depth = tl.load(row_w + 2, mask=is_unit, other=0.0)
    shared = tl.load(hidden_b_ptr + unit, mask=is_unit, other=0.0) + entropy * w_entropy + depth * w_depth
    pre = probability[:, None] * w_joint[None, :]  # [BLOCK_K, BLOCK_H]
    if NUM_FEATURES == 6:  # the extended set: the child's own probability, its parent's joint one, its rank
        shared += tl.exp(parent) * tl.load(row_w + 4, mask=is_unit, other=0.0)
        pre += tl.exp(logprobs)[:, None] * tl.load(row_w + 3, mask=is_unit, other=0.0)[None, :]
        pre += child.to(tl.float32)[:, None] * tl.load(row_w + 5, mask=is_unit, other=0.0)[None, :]
    units = tl.maximum(pre + shared[None, :], 0.0)  # [BLOCK_K, BLOCK_H]
    w_out = tl.load(out_w_ptr + unit, mask=is_unit, other=0.0)
    logit = tl.sum(units * w_out[None, :], 1) + tl.load(out_b_ptr)  # [BLOCK_K]
    kept = logit >= tl.load(cut_ptr)
    tl.store(out_ptr + row * k + child, tl.where(kept, logprobs, -float("inf")), mask=is_child)


def prune_children_triton(child_logprobs: torch.Tensor, parent_scores: torch.Tensor, parent_logits: torch.Tensor,
                          depth: int, weights: ScorerWeights, top: int) -> torch.Tensor:
    """The reference's contract (reference.py), in one launch."""
    rows, k = child_logprobs.shape
    vocab = parent_logits.shape[1]
    if parent_logits.stride(-1) != 1:
        parent_logits = parent_logits.contiguous()
    out = torch.empty(rows, k, dtype=torch.float32, device=child_logprobs.device)
    hidden = weights.hidden_bias.shape[0]
    block = next_power_of_2(vocab)
    _prune_children_kernel[(rows,)](
        child_logprobs.contiguous(), parent_scores.contiguous(), parent_logits, parent_logits.stride(0), vocab,
        min(top, vocab), float(depth), weights.hidden_weight.contiguous(), weights.hidden_bias, weights.out_weight,
        weights.out_bias, weights.cut, out, k, hidden, BLOCK_V=block, KEY_SHIFT=key_shift(parent_logits.dtype),
        BLOCK_K=next_power_of_2(k), BLOCK_H=next_power_of_2(hidden), NUM_FEATURES=weights.hidden_weight.shape[1],
        num_warps=row_warps(block))
    return out
