"""Sampled children in two launches. Stage 1, one program per (row, vocabulary chunk): the chunk's max and sum of
exp of logits / T (the log-softmax normaliser), its own top k (packed keys, as draft_topk's) and its Gumbel-max
candidate (the largest logits / T - log of the Exp(1) draw, lowest id on ties). Stage 2, one program per row: the
row's logsumexp, the sampled token (the best chunk candidate), the k - 1 best keys besides it, the d2t map, and log q
written out chunk by chunk (a row without a finite logsumexp is untrusted: reference.py). The Gumbel-max reads
logits / T + Gumbel noise (the argmax of log q + noise, short of rounding)."""
import torch
import triton
import triton.language as tl

from specdraft.core.errors import SpecdraftError
from specdraft.kernels.draft_topk.triton_kernel import EMPTY_KEY, store_chunk_topk, unpack_key
from specdraft.kernels.launch import next_power_of_2, split_block


@triton.jit
def _scaled(logits_ptr, row_stride, row, ids, vocab, temperature, SCALE: tl.constexpr):
    logits = tl.load(logits_ptr + row.to(tl.int64) * row_stride + ids, mask=ids < vocab,
                     other=-float("inf")).to(tl.float32)
    if SCALE:
        logits = logits / temperature
    return logits


@triton.jit
def _chunk_kernel(logits_ptr, row_stride, vocab, temperature, noise_ptr, noise_stride, keys_ptr, chunk_max_ptr,
                  chunk_sumexp_ptr, perturbed_ptr, perturbed_id_ptr, num_chunks, K: tl.constexpr,
                  SCALE: tl.constexpr, BLOCK_V: tl.constexpr):
    chunk, row = tl.program_id(0), tl.program_id(1)
    ids = chunk * BLOCK_V + tl.arange(0, BLOCK_V)  # [BLOCK_V]
    in_vocab = ids < vocab
    logits = _scaled(logits_ptr, row_stride, row, ids, vocab, temperature, SCALE)
    slot = row * num_chunks + chunk
    store_chunk_topk(logits, ids, in_vocab, slot, keys_ptr, chunk_max_ptr, chunk_sumexp_ptr, K)
    exponential = tl.load(noise_ptr + row.to(tl.int64) * noise_stride + ids, mask=in_vocab, other=1.0)
    perturbed = tl.where(in_vocab, logits - tl.log(exponential), -float("inf"))  # + Gumbel noise
    best = tl.max(perturbed, 0)
    tl.store(perturbed_ptr + slot, best)
    tl.store(perturbed_id_ptr + slot, tl.min(tl.where(perturbed == best, ids, vocab), 0))


@triton.jit
def _merge_kernel(logits_ptr, row_stride, vocab, temperature, keys_ptr, chunk_max_ptr, chunk_sumexp_ptr,
                  perturbed_ptr, perturbed_id_ptr, d2t_ptr, scores_ptr, target_ids_ptr, logprobs_ptr, num_chunks,
                  K: tl.constexpr, SCALE: tl.constexpr, BLOCK_V: tl.constexpr, NUM_CHUNKS: tl.constexpr,
                  BLOCK_CHUNKS: tl.constexpr, BLOCK_CANDIDATES: tl.constexpr):
    row = tl.program_id(0)
    chunks = tl.arange(0, BLOCK_CHUNKS)
    is_chunk = chunks < num_chunks
    chunk_max = tl.load(chunk_max_ptr + row * num_chunks + chunks, mask=is_chunk, other=-float("inf"))
    chunk_sumexp = tl.load(chunk_sumexp_ptr + row * num_chunks + chunks, mask=is_chunk, other=0.0)
    row_max = tl.max(chunk_max, 0)
    shift = tl.where(row_max == -float("inf"), 0.0, row_max)
    log_normaliser = shift + tl.log(tl.sum(chunk_sumexp * tl.exp(chunk_max - shift), 0))
    perturbed = tl.load(perturbed_ptr + row * num_chunks + chunks, mask=is_chunk, other=-float("inf"))
    perturbed_ids = tl.load(perturbed_id_ptr + row * num_chunks + chunks, mask=is_chunk, other=vocab)
    best = tl.max(perturbed, 0)
    sampled = tl.min(tl.where(perturbed == best, perturbed_ids, vocab), 0)  # chunks ascend: the lowest id
    trusted = tl.abs(log_normaliser) < float("inf")  # a NaN, +inf or all--inf row: untrusted (reference.py)
    sampled = tl.where(trusted, sampled, 0)
    tl.store(scores_ptr + row * K, tl.where(trusted, 0.0, -float("inf")))
    tl.store(target_ids_ptr + row * K, sampled + tl.load(d2t_ptr + sampled))
    candidates = tl.arange(0, BLOCK_CANDIDATES)
    keys = tl.load(keys_ptr + row * num_chunks * K + candidates, mask=candidates < num_chunks * K,
                   other=EMPTY_KEY)  # [BLOCK_CANDIDATES]
    keys = tl.where((0x7FFFFFFF - (keys & 0x7FFFFFFF)) == sampled, EMPTY_KEY, keys)  # ranked first already
    for rank in tl.static_range(1, K):
        top = tl.max(keys, 0)
        keys = tl.where(keys == top, EMPTY_KEY, keys)
        logit, draft_id = unpack_key(top)
        draft_id = tl.where(trusted, draft_id, rank)
        tl.store(scores_ptr + row * K + rank, tl.where(trusted, logit - log_normaliser, -float("inf")))
        tl.store(target_ids_ptr + row * K + rank, draft_id + tl.load(d2t_ptr + draft_id))
    for chunk in range(NUM_CHUNKS):  # a constant trip count (the interpreter's loops need one)
        ids = chunk * BLOCK_V + tl.arange(0, BLOCK_V)
        logits = _scaled(logits_ptr, row_stride, row, ids, vocab, temperature, SCALE)
        point_mass = tl.where(ids == sampled, 0.0, -float("inf"))
        tl.store(logprobs_ptr + row.to(tl.int64) * vocab + ids, tl.where(trusted, logits - log_normaliser, point_mass),
                 mask=ids < vocab)


def sampled_topk_triton(draft_logits: torch.Tensor, d2t: torch.Tensor, k: int, exponential: torch.Tensor,
                        temperature: float, block_v: int | None = None, logprobs_out: torch.Tensor | None = None):
    """Same contract as `sampled_topk`. `block_v` (a power of two) overrides the chunk width."""
    rows, vocab = draft_logits.shape
    if not 1 <= k <= vocab:
        raise SpecdraftError(f"sampled_topk: k={k} must be between 1 and the draft vocabulary size {vocab}")
    if draft_logits.stride(-1) != 1:
        draft_logits = draft_logits.contiguous()
    if exponential.stride(-1) != 1:
        exponential = exponential.contiguous()
    device = draft_logits.device
    block_v = block_v or split_block(rows, vocab, device, 1024, 4096)
    num_chunks = triton.cdiv(vocab, block_v)
    keys = torch.empty(rows, num_chunks, k, dtype=torch.int64, device=device)
    chunk_max = torch.empty(rows, num_chunks, dtype=torch.float32, device=device)
    chunk_sumexp, perturbed = torch.empty_like(chunk_max), torch.empty_like(chunk_max)
    perturbed_ids = torch.empty(rows, num_chunks, dtype=torch.int64, device=device)
    scores = torch.empty(rows, k, dtype=torch.float32, device=device)
    target_ids = torch.empty(rows, k, dtype=torch.int64, device=device)
    logprobs = torch.empty(rows, vocab, dtype=torch.float32, device=device) if logprobs_out is None else logprobs_out
    if logprobs.shape != (rows, vocab) or logprobs.stride() != (vocab, 1) or logprobs.dtype != torch.float32:
        raise SpecdraftError(f"sampled_topk: logprobs_out must be contiguous float32 [{rows}, {vocab}], got "
                             f"{logprobs.dtype} {tuple(logprobs.shape)} strides {logprobs.stride()}")
    if rows == 0:
        return scores, target_ids, logprobs
    scale = temperature != 1.0
    _chunk_kernel[(num_chunks, rows)](draft_logits, draft_logits.stride(0), vocab, float(temperature), exponential,
                                      exponential.stride(0), keys, chunk_max, chunk_sumexp, perturbed, perturbed_ids,
                                      num_chunks, K=k, SCALE=scale, BLOCK_V=block_v,
                                      num_warps=8 if block_v >= 4096 else 4)
    _merge_kernel[(rows,)](draft_logits, draft_logits.stride(0), vocab, float(temperature), keys, chunk_max,
                           chunk_sumexp, perturbed, perturbed_ids, d2t, scores, target_ids, logprobs, num_chunks,
                           K=k, SCALE=scale, BLOCK_V=block_v, NUM_CHUNKS=num_chunks,
                           BLOCK_CHUNKS=next_power_of_2(num_chunks),
                           BLOCK_CANDIDATES=next_power_of_2(num_chunks * k), num_warps=4)
    return scores, target_ids, logprobs
