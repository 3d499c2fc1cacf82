"""Top-M entropy in one launch, one program per row, without sorting: the M-th largest logit is found by
bisection over the logits' order-preserving 32-bit keys (one count a step, exact), then the entropy of the
softmax over the logits above it, the tied ones at it weighted to make up exactly M (ties share one value, so
which of them `topk` would pick does not change the entropy). Replaces a log-softmax, a top-1000 (a sort) and
five pointwise launches per call. The keys of bf16 (fp16) logits carry 16 (19) bits, so their bisection takes
16 (19) steps, not 32. `top_entropy_row` is the row's computation, shared with `kernels.prune_children`."""
import torch
import triton
import triton.language as tl

from specdraft.kernels.launch import next_power_of_2

KEY_SHIFT = {torch.bfloat16: 16, torch.float16: 13}
"""Low bits of a float32 key that are zero for logits of a narrower dtype (float32: none)."""


def key_shift(dtype: torch.dtype) -> int:
    return KEY_SHIFT.get(dtype, 0)


def row_warps(block: int) -> int:
    return 16 if block >= 16384 else 8 if block >= 2048 else 4


@triton.jit
def top_entropy_row(row_ptr, vocab, top, BLOCK_V: tl.constexpr, KEY_SHIFT: tl.constexpr):
    """One row's logits (vocab of them at row_ptr) -> the entropy (nats, float32) of its softmax over its `top`
    largest, renormalised."""
    ids = tl.arange(0, BLOCK_V)
    valid = ids < vocab
    x = tl.load(row_ptr + ids, mask=valid, other=-float("inf")).to(tl.float32)
    bits = (x + 0.0).to(tl.int32, bitcast=True)  # + 0.0 folds -0.0 into +0.0
    keys = (bits ^ ((bits >> 31) & 0x7FFFFFFF)) >> KEY_SHIFT  # signed-int order == float order (zero bits out)
    low = tl.min(tl.where(valid, keys, 0x7FFFFFFF), 0).to(tl.int64)  # count(keys >= low) = vocab >= top
    high = tl.max(tl.where(valid, keys, -0x7FFFFFFF - 1), 0).to(tl.int64) + 1  # count(keys >= high) = 0 < top
    for _ in range(32 - KEY_SHIFT):  # the keys span < 2 ** (32 - KEY_SHIFT): afterwards high == low + 1
        middle = low + (high - low) // 2
        enough = tl.sum((valid & (keys >= middle.to(tl.int32))).to(tl.int32), 0) >= top
        low = tl.where(enough, middle, low)
        high = tl.where(enough, high, middle)
    threshold = low.to(tl.int32)  # the M-th largest key
    above = valid & (keys > threshold)
    tied = valid & (keys == threshold)
    fill = (top - tl.sum(above.to(tl.float32), 0)) / tl.sum(tied.to(tl.float32), 0)  # tied ones' share of M
    weight = tl.where(above, 1.0, tl.where(tied, fill, 0.0))
    row_max = tl.max(x, 0)
    shift = tl.where(row_max == -float("inf"), 0.0, row_max)
    scaled = weight * tl.exp(x - shift)  # [BLOCK_V]
    total = tl.sum(scaled, 0)
    centred = tl.where(scaled > 0, x - shift, 0.0)
    return tl.log(total) - tl.sum(scaled * centred, 0) / total


@triton.jit
def _top_entropy_kernel(logits_ptr, row_stride, vocab, top, out_ptr, BLOCK_V: tl.constexpr,
                        KEY_SHIFT: tl.constexpr):
    row = tl.program_id(0)
    entropy = top_entropy_row(logits_ptr + row.to(tl.int64) * row_stride, vocab, top, BLOCK_V, KEY_SHIFT)
    tl.store(out_ptr + row, entropy)


def top_entropy_triton(logits: torch.Tensor, top: int) -> torch.Tensor:
    """Same contract as `top_entropy_reference`."""
    rows, vocab = logits.shape
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    out = torch.empty(rows, dtype=torch.float32, device=logits.device)
    block = next_power_of_2(vocab)
    _top_entropy_kernel[(rows,)](logits, logits.stride(0), vocab, min(top, vocab), out, BLOCK_V=block,
                                 KEY_SHIFT=key_shift(logits.dtype), num_warps=row_warps(block))
    return out
