"""Soft cross-entropy as one Triton program per row: an online softmax over vocabulary blocks for the draft and
the target in one pass (loss), then, when the draft needs a gradient, a second pass over the same row writing
d loss / d draft_logits in the logits' dtype.

No [N, V] float32 tensor exists. The gradient is computed in the forward and kept instead of the logits (the
caller drops its logits after the call), so the backward is one scale by grad_output. Imported only where
Triton is installed; runs on CUDA tensors, and on CPU tensors under TRITON_INTERPRET=1 (the tests).
"""
import torch
import triton
import triton.language as tl

MAX_BLOCK_V = 4096


@triton.jit
def _exp_minus(values, maximum):
    """exp(values - maximum), and 0 (not nan) while the maximum is still -inf (then values are -inf too)."""
    return tl.exp(values - tl.where(maximum == float("-inf"), 0.0, maximum))


@triton.jit
def _soft_ce_rows(draft_ptr, target_ptr, weight_ptr, loss_ptr, grad_ptr,
                  draft_stride, target_stride, grad_stride,
                  VOCAB: tl.constexpr, BLOCK_V: tl.constexpr, WRITE_GRAD: tl.constexpr):
    """Row n: loss_n = w_n * (lse(draft_n) - sum_v softmax(target_n)_v * draft_n,v);
    grad_n = w_n * (softmax(draft_n) - softmax(target_n))."""
    row = tl.program_id(0).to(tl.int64)
    draft_row = draft_ptr + row * draft_stride
    target_row = target_ptr + row * target_stride
    weight = tl.load(weight_ptr + row).to(tl.float32)
    offsets = tl.arange(0, BLOCK_V)
    draft_max = float("-inf")
    draft_sum = 0.0
    target_max = float("-inf")
    target_sum = 0.0
    cross = 0.0  # sum_v exp(target_v - target_max) * draft_v
    for start in range(0, VOCAB, BLOCK_V):
        cols = start + offsets
        in_row = cols < VOCAB
        draft_block = tl.load(draft_row + cols, mask=in_row, other=float("-inf")).to(tl.float32)
        target_block = tl.load(target_row + cols, mask=in_row, other=float("-inf")).to(tl.float32)
        new_draft_max = tl.maximum(draft_max, tl.max(draft_block, axis=0))
        draft_exp = _exp_minus(draft_block, new_draft_max)
        draft_sum = draft_sum * _exp_minus(draft_max, new_draft_max) + tl.sum(draft_exp, axis=0)
        draft_max = new_draft_max
        new_target_max = tl.maximum(target_max, tl.max(target_block, axis=0))
        target_exp = _exp_minus(target_block, new_target_max)
        target_rescale = _exp_minus(target_max, new_target_max)
        target_sum = target_sum * target_rescale + tl.sum(target_exp, axis=0)
        cross = cross * target_rescale + tl.sum(target_exp * tl.where(in_row, draft_block, 0.0), axis=0)
        target_max = new_target_max
    draft_lse = draft_max + tl.log(draft_sum)
    target_lse = target_max + tl.log(target_sum)
    tl.store(loss_ptr + row, weight * (draft_lse - cross / target_sum))
    if WRITE_GRAD:
        grad_row = grad_ptr + row * grad_stride
        for start in range(0, VOCAB, BLOCK_V):
            cols = start + offsets
            in_row = cols < VOCAB
            draft_block = tl.load(draft_row + cols, mask=in_row, other=float("-inf")).to(tl.float32)
            target_block = tl.load(target_row + cols, mask=in_row, other=float("-inf")).to(tl.float32)
            grad = weight * (tl.exp(draft_block - draft_lse) - tl.exp(target_block - target_lse))
            tl.store(grad_row + cols, grad.to(grad_ptr.dtype.element_ty), mask=in_row)


@triton.jit
def _scale(values_ptr, scale_ptr, out_ptr, numel, BLOCK: tl.constexpr):
    """out = values * scale[0], in float32 arithmetic, stored in out's dtype."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    in_range = offsets < numel
    scale = tl.load(scale_ptr).to(tl.float32)
    values = tl.load(values_ptr + offsets, mask=in_range).to(tl.float32)
    tl.store(out_ptr + offsets, (values * scale).to(out_ptr.dtype.element_ty), mask=in_range)


def _row_major(logits: torch.Tensor) -> torch.Tensor:
    return logits if logits.stride(-1) == 1 else logits.contiguous()


def soft_ce_rows(draft_logits: torch.Tensor, target_logits: torch.Tensor, row_weights: torch.Tensor,
                 write_grad: bool):
    """draft_logits, target_logits [N, V] (rows may be strided); row_weights [N] ->
    (weighted loss per row [N] float32, gradient [N, V] in the draft's dtype or None)."""
    draft_logits, target_logits = _row_major(draft_logits), _row_major(target_logits)
    rows, vocab = draft_logits.shape
    weights = row_weights.to(device=draft_logits.device, dtype=torch.float32).contiguous()
    row_loss = torch.empty(rows, device=draft_logits.device, dtype=torch.float32)
    grad = torch.empty_like(draft_logits, memory_format=torch.contiguous_format) if write_grad else row_loss
    block = min(MAX_BLOCK_V, triton.next_power_of_2(vocab))
    if rows:
        _soft_ce_rows[(rows,)](draft_logits, target_logits, weights, row_loss, grad,
                               draft_logits.stride(0), target_logits.stride(0), grad.stride(0) if write_grad else 0,
                               VOCAB=vocab, BLOCK_V=block, WRITE_GRAD=write_grad, num_warps=8 if block >= 2048 else 4)
    return row_loss, (grad if write_grad else None)


def scaled(values: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """values * scale (a one-element tensor) without rounding the scale to values' dtype, and without a sync."""
    out = torch.empty_like(values)
    block = 4096
    _scale[(triton.cdiv(values.numel(), block),)](values, scale.to(torch.float32).reshape(1), out, values.numel(),
                                                   BLOCK=block)
    return out


class TritonSoftCrossEntropy(torch.autograd.Function):
    """sum_n w_n * CE(softmax(target_n), draft_n); the draft's gradient is computed in the forward."""

    @staticmethod
    def forward(ctx, draft_logits, target_logits, row_weights):
        row_loss, grad = soft_ce_rows(draft_logits, target_logits, row_weights, ctx.needs_input_grad[0])
        ctx.save_for_backward(grad if grad is not None else row_loss.new_empty(0))
        return row_loss.sum()

    @staticmethod
    def backward(ctx, grad_total):
        (grad,) = ctx.saved_tensors
        return scaled(grad, grad_total), None, None
