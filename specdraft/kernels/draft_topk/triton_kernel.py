"""Draft top-k in two launches. Stage 1, one program per (row, vocabulary chunk): the chunk's max and sum of
exp (for the log-softmax normaliser) and its own top k. Stage 2, one program per row: merges the chunks'
normalisers into the row's logsumexp and their candidates into the row's top k, then maps draft ids to target
ids through d2t (a row without a finite logsumexp is untrusted: reference.py). Each (logit, draft id) pair is
packed into one int64 sort key (logit order in the high word, lower id wins ties in the low word), so a top-k step
is a single max reduction."""
import torch
import triton
import triton.language as tl

from specdraft.core.errors import SpecdraftError
from specdraft.kernels.launch import next_power_of_2, split_block

EMPTY_KEY = tl.constexpr(-(2 ** 63))  # below every packed key


@triton.jit
def pack_keys(logits, ids):
    """float32 logits, int ids -> int64 keys ordered by logit, then by lower id."""
    bits = (logits + 0.0).to(tl.int32, bitcast=True)  # + 0.0 folds -0.0 into +0.0
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # signed-int order == float order
    return (ordered.to(tl.int64) << 32) | (0x7FFFFFFF - ids).to(tl.int64)


@triton.jit
def unpack_key(key):
    """int64 key -> (float32 logit, int64 id)."""
    ordered = (key >> 32).to(tl.int32)
    logit = (ordered ^ ((ordered >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)
    return logit, 0x7FFFFFFF - (key & 0x7FFFFFFF)  # the low word is 0x7FFFFFFF - id, below 2 ** 31


@triton.jit
def store_chunk_topk(logits, ids, in_vocab, slot, keys_ptr, chunk_max_ptr, chunk_sumexp_ptr, K: tl.constexpr):
    """A chunk's float32 logits [BLOCK_V] -> its max and sum of exp (the log-softmax normaliser's share) at `slot`,
    and its top K packed keys at keys_ptr[slot * K:]."""
    chunk_max = tl.max(logits, 0)
    shift = tl.where(chunk_max == -float("inf"), 0.0, chunk_max)
    tl.store(chunk_max_ptr + slot, chunk_max)
    tl.store(chunk_sumexp_ptr + slot, tl.sum(tl.exp(logits - shift), 0))
    keys = tl.where(in_vocab, pack_keys(logits, ids), EMPTY_KEY)  # [BLOCK_V]
    for rank in tl.static_range(K):
        best = tl.max(keys, 0)
        tl.store(keys_ptr + slot * K + rank, best)
        keys = tl.where(keys == best, EMPTY_KEY, keys)


@triton.jit
def _chunk_topk_kernel(logits_ptr, row_stride, vocab, keys_ptr, chunk_max_ptr, chunk_sumexp_ptr, num_chunks,
                       K: tl.constexpr, BLOCK_V: tl.constexpr):
    chunk, row = tl.program_id(0), tl.program_id(1)
    ids = chunk * BLOCK_V + tl.arange(0, BLOCK_V)  # [BLOCK_V]
    in_vocab = ids < vocab
    logits = tl.load(logits_ptr + row.to(tl.int64) * row_stride + ids, mask=in_vocab,
                     other=-float("inf")).to(tl.float32)
    store_chunk_topk(logits, ids, in_vocab, row * num_chunks + chunk, keys_ptr, chunk_max_ptr, chunk_sumexp_ptr, K)


@triton.jit
def _merge_topk_kernel(keys_ptr, chunk_max_ptr, chunk_sumexp_ptr, d2t_ptr, logprobs_ptr, target_ids_ptr,
                       num_chunks, K: tl.constexpr, BLOCK_CHUNKS: tl.constexpr, BLOCK_CANDIDATES: tl.constexpr):
    row = tl.program_id(0)
    chunks = tl.arange(0, BLOCK_CHUNKS)
    chunk_max = tl.load(chunk_max_ptr + row * num_chunks + chunks, mask=chunks < num_chunks, other=-float("inf"))
    chunk_sumexp = tl.load(chunk_sumexp_ptr + row * num_chunks + chunks, mask=chunks < num_chunks, other=0.0)
    row_max = tl.max(chunk_max, 0)
    shift = tl.where(row_max == -float("inf"), 0.0, row_max)
    log_normaliser = shift + tl.log(tl.sum(chunk_sumexp * tl.exp(chunk_max - shift), 0))
    candidates = tl.arange(0, BLOCK_CANDIDATES)
    keys = tl.load(keys_ptr + row * num_chunks * K + candidates, mask=candidates < num_chunks * K,
                   other=EMPTY_KEY)  # [BLOCK_CANDIDATES]
    trusted = tl.abs(log_normaliser) < float("inf")  # a NaN, +inf or all--inf row: untrusted (reference.py)
    for rank in tl.static_range(K):
        best = tl.max(keys, 0)
        keys = tl.where(keys == best, EMPTY_KEY, keys)
        logit, draft_id = unpack_key(best)
        draft_id = tl.where(trusted, draft_id, rank)
        tl.store(logprobs_ptr + row * K + rank, tl.where(trusted, logit - log_normaliser, -float("inf")))
        tl.store(target_ids_ptr + row * K + rank, draft_id + tl.load(d2t_ptr + draft_id))


def draft_topk_triton(draft_logits: torch.Tensor, d2t: torch.Tensor, k: int, block_v: int | None = None):
    """draft_logits [N, Vd]; d2t [Vd] int64 -> (topk_logprobs [N, k] float32, topk_target_ids [N, k] int64).
    `block_v` (a power of two) overrides the chunk width (tests use it to force several chunks)."""
    rows, vocab = draft_logits.shape
    if not 1 <= k <= vocab:
        raise SpecdraftError(f"draft_topk: k={k} must be between 1 and the draft vocabulary size {vocab}")
    if draft_logits.stride(-1) != 1:
        draft_logits = draft_logits.contiguous()
    block_v = block_v or split_block(rows, vocab, draft_logits.device, 1024, 4096)
    num_chunks = triton.cdiv(vocab, block_v)
    device = draft_logits.device
    keys = torch.empty(rows, num_chunks, k, dtype=torch.int64, device=device)
    chunk_max = torch.empty(rows, num_chunks, dtype=torch.float32, device=device)
    chunk_sumexp = torch.empty_like(chunk_max)
    topk_logprobs = torch.empty(rows, k, dtype=torch.float32, device=device)
    topk_target_ids = torch.empty(rows, k, dtype=torch.int64, device=device)
    if rows == 0:
        return topk_logprobs, topk_target_ids
    _chunk_topk_kernel[(num_chunks, rows)](draft_logits, draft_logits.stride(0), vocab, keys, chunk_max,
                                           chunk_sumexp, num_chunks, K=k, BLOCK_V=block_v,
                                           num_warps=8 if block_v >= 4096 else 4)
    _merge_topk_kernel[(rows,)](keys, chunk_max, chunk_sumexp, d2t, topk_logprobs, topk_target_ids, num_chunks,
                                K=k, BLOCK_CHUNKS=next_power_of_2(num_chunks),
                                BLOCK_CANDIDATES=next_power_of_2(num_chunks * k), num_warps=4)
    return topk_logprobs, topk_target_ids
