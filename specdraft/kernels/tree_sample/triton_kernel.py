"""Rejection-sampling acceptance over a draft tree in three launches from the target's logits. Stage 1, one program
per (node, vocabulary chunk): the chunk's max and sum of exp of logits / T (the softmax's normaliser; the
probabilities are never written out). Stage 2, the same grid: the chunk's sum of the distribution the node tests its
point-mass children against (p, or the residual max(0, p - q) when a sampled child of it is in the tree). Stage 3,
one program: every node's test at once, the walk down the first passing children, and the bonus by inverse CDF: the
chunk the uniform lands in from the last node's chunk sums (its rejected children's mass taken out), then the token
inside that chunk. q over the target vocabulary is read through `draft_index` (target id -> draft index), built once
per d2t."""
from typing import Dict, Optional, Tuple

import torch
import triton
import triton.language as tl

from specdraft.kernels.launch import next_power_of_2

_DRAFT_INDEX: Dict[Tuple[int, int], Tuple[torch.Tensor, torch.Tensor]] = {}


def draft_index(d2t: torch.Tensor, vocab: int) -> torch.Tensor:
    """d2t [Vd] -> [vocab] int64: each target id's draft index (-1 outside the draft vocabulary). Built on the first
    call for a d2t tensor (a drafter's constant: a CUDA graph's warm-up builds it before the capture) and kept, so
    that a graph reads it at one address."""
    key = (id(d2t), vocab)
    hit = _DRAFT_INDEX.get(key)
    if hit is None or hit[0] is not d2t:
        draft_ids = torch.arange(d2t.shape[0], device=d2t.device)  # [Vd]
        index = torch.full((vocab,), -1, dtype=torch.long, device=d2t.device).index_copy_(0, draft_ids + d2t,
                                                                                            draft_ids)
        hit = _DRAFT_INDEX[key] = (d2t, index)
    return hit[1]


@triton.jit
def _draft_q(logprobs_ptr, draft_vocab, row, draft_ids):
    """q of draft indices `draft_ids` (-1: outside the draft vocabulary) in logprobs row `row` (-1: none) -> 0 where
    either is missing."""
    has = (draft_ids >= 0) & (row >= 0)
    logq = tl.load(logprobs_ptr + tl.maximum(row, 0).to(tl.int64) * draft_vocab + tl.maximum(draft_ids, 0),
                   mask=has, other=-float("inf"))
    return tl.where(has, tl.exp(logq), 0.0)


@triton.jit
def _scaled(logits_ptr, row_stride, rows, ids, mask, temperature, SCALE: tl.constexpr):
    """logits / T at rows `rows`, ids `ids` (float32; -inf where masked off)."""
    logits = tl.load(logits_ptr + rows.to(tl.int64) * row_stride + ids, mask=mask, other=-float("inf")).to(tl.float32)
    if SCALE:
        logits = logits / temperature
    return logits


@triton.jit
def _probs(logits_ptr, row_stride, rows, ids, mask, temperature, log_normaliser, SCALE: tl.constexpr):
    """softmax(logits / T) at rows `rows`, ids `ids`, from each row's log normaliser (0 where masked off)."""
    return tl.exp(_scaled(logits_ptr, row_stride, rows, ids, mask, temperature, SCALE) - log_normaliser)


@triton.jit
def _log_normalisers(chunk_max_ptr, chunk_sumexp_ptr, rows, num_chunks, mask, BLOCK_CHUNKS: tl.constexpr):
    """rows [B] -> their logsumexp of logits / T [B], from stage 1's chunk maxima and sums."""
    chunks = tl.arange(0, BLOCK_CHUNKS)
    slots = rows[:, None] * num_chunks + chunks[None, :]
    live = mask[:, None] & (chunks < num_chunks)[None, :]
    chunk_max = tl.load(chunk_max_ptr + slots, mask=live, other=-float("inf"))
    chunk_sumexp = tl.load(chunk_sumexp_ptr + slots, mask=live, other=0.0)
    row_max = tl.max(chunk_max, 1)
    shift = tl.where(row_max == -float("inf"), 0.0, row_max)
    total = tl.where(mask, tl.sum(chunk_sumexp * tl.exp(chunk_max - shift[:, None]), 1), 1.0)  # rows masked off: 1
    return shift + tl.log(total)


@triton.jit
def _stats_kernel(logits_ptr, row_stride, vocab, temperature, chunk_max_ptr, chunk_sumexp_ptr, num_chunks,
                  SCALE: tl.constexpr, BLOCK_V: tl.constexpr):
    chunk, node = tl.program_id(0), tl.program_id(1)
    ids = chunk * BLOCK_V + tl.arange(0, BLOCK_V)  # [BLOCK_V]
    logits = _scaled(logits_ptr, row_stride, node, ids, ids < vocab, temperature, SCALE)
    chunk_max = tl.max(logits, 0)
    shift = tl.where(chunk_max == -float("inf"), 0.0, chunk_max)
    tl.store(chunk_max_ptr + node * num_chunks + chunk, chunk_max)
    tl.store(chunk_sumexp_ptr + node * num_chunks + chunk, tl.sum(tl.exp(logits - shift), 0))


@triton.jit
def _residual_sums_kernel(logits_ptr, row_stride, vocab, temperature, chunk_max_ptr, chunk_sumexp_ptr, parents_ptr,
                          sampled_ptr, rows_ptr, logprobs_ptr, draft_vocab, t2d_ptr, sums_ptr, num_nodes, num_chunks,
                          DRAFTS: tl.constexpr, SCALE: tl.constexpr, BLOCK_V: tl.constexpr,
                          BLOCK_NODES: tl.constexpr, BLOCK_CHUNKS: tl.constexpr):
    chunk, node = tl.program_id(0), tl.program_id(1)
    ids = chunk * BLOCK_V + tl.arange(0, BLOCK_V)  # [BLOCK_V]
    in_vocab = ids < vocab
    row = tl.full([1], 0, tl.int32) + node  # [1]
    log_normaliser = tl.sum(_log_normalisers(chunk_max_ptr, chunk_sumexp_ptr, row, num_chunks, row >= 0,
                                             BLOCK_CHUNKS), 0)
    weights = _probs(logits_ptr, row_stride, node, ids, in_vocab, temperature, log_normaliser, SCALE)
    if DRAFTS:
        nodes = tl.arange(0, BLOCK_NODES)
        is_node = nodes < num_nodes
        parents = tl.load(parents_ptr + nodes, mask=is_node, other=-2)
        sampled = tl.load(sampled_ptr + nodes, mask=is_node, other=0) != 0
        tests = tl.max(((parents == node) & sampled).to(tl.int32), 0) > 0  # a sampled child of it is in the tree
        draft_ids = tl.load(t2d_ptr + ids, mask=in_vocab, other=-1)
        q = _draft_q(logprobs_ptr, draft_vocab, tl.load(rows_ptr + node), draft_ids)
        weights = tl.where(tests, tl.maximum(weights - q, 0.0), weights)
    tl.store(sums_ptr + node * num_chunks + chunk, tl.sum(weights, 0))


@triton.jit
def _accept_kernel(logits_ptr, row_stride, vocab, temperature, chunk_max_ptr, chunk_sumexp_ptr, tokens_ptr,
                   parents_ptr, sampled_ptr, rows_ptr, logprobs_ptr, draft_vocab, t2d_ptr, sums_ptr, num_chunks,
                   uniforms_ptr, num_nodes, accepted_ptr, accept_length_ptr, bonus_ptr, DEPTH: tl.constexpr,
                   DRAFTS: tl.constexpr, SCALE: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_NODES: tl.constexpr,
                   BLOCK_CHUNKS: tl.constexpr):
    nodes = tl.arange(0, BLOCK_NODES)  # [BN]
    chunks = tl.arange(0, BLOCK_CHUNKS)  # [BC]
    is_node = nodes < num_nodes
    tokens = tl.load(tokens_ptr + nodes, mask=is_node, other=0)
    parents = tl.load(parents_ptr + nodes, mask=is_node, other=-2)  # the root's -1 and padding: no node's child
    above = tl.maximum(parents, 0)
    has_parent = parents >= 0
    sums = tl.load(sums_ptr + nodes[:, None] * num_chunks + chunks[None, :],
                   mask=is_node[:, None] & (chunks < num_chunks)[None, :], other=0.0)  # [BN, BC]
    parent_of = nodes[None, :] == above[:, None]  # [BN, BN]: column n is row i's parent
    log_normalisers = _log_normalisers(chunk_max_ptr, chunk_sumexp_ptr, nodes, num_chunks, is_node, BLOCK_CHUNKS)
    parent_normaliser = tl.sum(tl.where(parent_of, log_normalisers[None, :], 0.0), 1)
    p_child = _probs(logits_ptr, row_stride, above, tokens, is_node, temperature, parent_normaliser, SCALE)
    if DRAFTS:
        sampled = (tl.load(sampled_ptr + nodes, mask=is_node, other=0) != 0) & has_parent
        tests = tl.max(((parents[None, :] == nodes[:, None]) & sampled[None, :]).to(tl.int32), 1)  # [BN] per node
        parent_tests = tl.sum(tl.where(parent_of, tests[None, :], 0), 1) > 0
        parent_sum = tl.maximum(tl.sum(tl.where(parent_of, tl.sum(sums, 1)[None, :], 0.0), 1), 1e-30)
        q_child = _draft_q(logprobs_ptr, draft_vocab, tl.load(rows_ptr + above, mask=is_node, other=-1),
                           tl.load(t2d_ptr + tokens, mask=is_node, other=-1))
        residual = tl.where(parent_tests, tl.maximum(p_child - q_child, 0.0), p_child)  # at the parent, unnormalised
        child_probs = residual / parent_sum
        ratios = p_child / tl.maximum(q_child, 1e-30)
    else:
        sampled = nodes < 0
        residual = p_child
        child_probs = p_child
        ratios = p_child
    point_mass = has_parent & ~sampled
    probs = tl.where(point_mass, child_probs, 0.0)
    earlier = (parents[:, None] == parents[None, :]) & (nodes[None, :] < nodes[:, None])  # [BN, BN]
    remaining = 1.0 - tl.sum(tl.where(earlier, probs[None, :], 0.0), 1)
    uniforms = tl.load(uniforms_ptr + nodes, mask=is_node, other=1.0)
    passes = (point_mass & (uniforms * remaining < probs)) | (sampled & (uniforms < ratios))
    first = passes & (tl.max((earlier & passes[None, :]).to(tl.int32), 1) == 0)
    current = tl.full([], 0, tl.int32)  # the root
    accept_length = tl.full([], 0, tl.int64)
    tl.store(accepted_ptr, current.to(tl.int64))
    for step in tl.static_range(1, DEPTH + 1):  # a stopped walk stays stopped: no first-passing child
        child = tl.min(tl.where(first & (parents == current), nodes, BLOCK_NODES), 0)
        found = child < BLOCK_NODES
        tl.store(accepted_ptr + step, tl.where(found, child, -1).to(tl.int64))
        accept_length += found.to(tl.int64)
        current = tl.where(found, child, current)
    tl.store(accept_length_ptr, accept_length)
    # the bonus: the last node's chunk sums without its rejected point-mass children (each token once)
    rejected = point_mass & (parents == current)
    repeated = tl.max((rejected[None, :] & (tokens[None, :] == tokens[:, None]) & (nodes[None, :] < nodes[:, None]))
                      .to(tl.int32), 1) > 0
    taken_out = tl.sum(tl.where((rejected & ~repeated)[:, None] & ((tokens // BLOCK_V)[:, None] == chunks[None, :]),
                                residual[:, None], 0.0), 0)  # [BC]
    chunk_sums = tl.maximum(tl.sum(tl.where(nodes[:, None] == current, sums, 0.0), 0) - taken_out, 0.0)
    chunk_cdf = tl.cumsum(chunk_sums, 0)  # [BC]
    target = tl.load(uniforms_ptr + num_nodes) * tl.max(chunk_cdf, 0)
    chunk = tl.min(tl.where((chunk_cdf > target) & (chunks < num_chunks), chunks, BLOCK_CHUNKS), 0)
    before = tl.sum(tl.where(chunks < chunk, chunk_sums, 0.0), 0)
    ids = chunk * BLOCK_V + tl.arange(0, BLOCK_V)  # [BLOCK_V]
    live = (ids < vocab) & (chunk < BLOCK_CHUNKS)
    node_normaliser = tl.sum(tl.where(nodes == current, log_normalisers, 0.0), 0)
    weights = _probs(logits_ptr, row_stride, current, ids, live, temperature, node_normaliser, SCALE)
    if DRAFTS:
        node_tests = tl.sum(tl.where(nodes == current, tests, 0), 0) > 0
        node_row = tl.load(rows_ptr + current)
        q = _draft_q(logprobs_ptr, draft_vocab, node_row, tl.load(t2d_ptr + ids, mask=live, other=-1))
        weights = tl.where(node_tests, tl.maximum(weights - q, 0.0), weights)
    banned = tl.max(((ids[:, None] == tokens[None, :]) & rejected[None, :]).to(tl.int32), 1) > 0
    weights = tl.where(banned | ~live, 0.0, weights)
    cdf = before + tl.cumsum(weights, 0)
    pick = tl.min(tl.where((cdf > target) & live, ids, vocab), 0)
    last_positive = tl.max(tl.where(weights > 0, ids, -1), 0)  # where rounding left the chunk short of the target
    pick = tl.where(pick < vocab, pick, tl.where(last_positive >= 0, last_positive, vocab - 1))
    tl.store(bonus_ptr, pick.to(tl.int64))


def verify_sampled_triton(target_logits: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor,
                          uniforms: torch.Tensor, depth_limit: int, temperature: float,
                          rows: Optional[torch.Tensor] = None, logprobs: Optional[torch.Tensor] = None,
                          d2t: Optional[torch.Tensor] = None, sampled: Optional[torch.Tensor] = None,
                          block_v: int = 1024):
    """The contract of `verify_sampled` (depths unread: the walk counts its steps) -> (accepted_nodes
    [depth_limit + 1], accept_length [1], bonus [1]) int64. `block_v` (a power of two) is the chunk width."""
    num_nodes, vocab = target_logits.shape
    device = target_logits.device
    if target_logits.stride(-1) != 1:
        target_logits = target_logits.contiguous()
    block_v = min(block_v, next_power_of_2(vocab))
    num_chunks = triton.cdiv(vocab, block_v)
    drafts = sampled is not None
    if drafts:
        draft_args = (sampled.view(torch.uint8), rows.contiguous(), logprobs.contiguous(), logprobs.shape[1],
                      draft_index(d2t, vocab))
    else:
        draft_args = (tokens, tokens, uniforms, 0, tokens)  # unread
    chunk_max, chunk_sumexp, sums = (torch.empty(num_nodes, num_chunks, dtype=torch.float32, device=device)
                                     for _ in range(3))
    accepted_nodes = torch.empty(depth_limit + 1, dtype=torch.int64, device=device)
    accept_length = torch.empty(1, dtype=torch.int64, device=device)
    bonus = torch.empty(1, dtype=torch.int64, device=device)
    block_nodes, block_chunks, scale = next_power_of_2(num_nodes), next_power_of_2(num_chunks), temperature != 1.0
    logits = (target_logits, target_logits.stride(0), vocab, float(temperature))
    _stats_kernel[(num_chunks, num_nodes)](*logits, chunk_max, chunk_sumexp, num_chunks, SCALE=scale,
                                           BLOCK_V=block_v, num_warps=4)
    _residual_sums_kernel[(num_chunks, num_nodes)](*logits, chunk_max, chunk_sumexp, parents, *draft_args, sums,
                                                   num_nodes, num_chunks, DRAFTS=drafts, SCALE=scale,
                                                   BLOCK_V=block_v, BLOCK_NODES=block_nodes,
                                                   BLOCK_CHUNKS=block_chunks, num_warps=4)
    _accept_kernel[(1,)](*logits, chunk_max, chunk_sumexp, tokens, parents, *draft_args, sums, num_chunks, uniforms,
                         num_nodes, accepted_nodes, accept_length, bonus, DEPTH=depth_limit, DRAFTS=drafts,
                         SCALE=scale, BLOCK_V=block_v, BLOCK_NODES=block_nodes, BLOCK_CHUNKS=block_chunks,
                         num_warps=8)
    return accepted_nodes, accept_length, bonus
