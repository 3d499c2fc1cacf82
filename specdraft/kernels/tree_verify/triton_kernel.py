"""Greedy tree verification in two launches. Stage 1, one program per (node, vocabulary chunk): the chunk's max
logit and its first argmax. Stage 2, one program: each node's argmax from its chunks (the first maximal chunk
keeps the lowest id), then the walk from the root, `depth_limit` vector steps over the nodes."""
import torch
import triton
import triton.language as tl

from specdraft.kernels.launch import next_power_of_2, split_block


@triton.jit
def _chunk_argmax_kernel(logits_ptr, row_stride, vocab, chunk_max_ptr, chunk_argmax_ptr, num_chunks,
                         BLOCK_V: tl.constexpr):
    chunk, node = tl.program_id(0), tl.program_id(1)
    ids = chunk * BLOCK_V + tl.arange(0, BLOCK_V)  # [BLOCK_V]
    logits = tl.load(logits_ptr + node.to(tl.int64) * row_stride + ids, mask=ids < vocab,
                     other=-float("inf")).to(tl.float32)
    slot = node * num_chunks + chunk
    tl.store(chunk_max_ptr + slot, tl.max(logits, 0))
    tl.store(chunk_argmax_ptr + slot, chunk * BLOCK_V + tl.argmax(logits, 0, tie_break_left=True))


@triton.jit
def _walk_kernel(chunk_max_ptr, chunk_argmax_ptr, num_chunks, tokens_ptr, parents_ptr, num_nodes,
                 accepted_ptr, accept_length_ptr, bonus_ptr,
                 DEPTH: tl.constexpr, BLOCK_NODES: tl.constexpr, BLOCK_CHUNKS: tl.constexpr):
    nodes = tl.arange(0, BLOCK_NODES)  # [BLOCK_NODES]
    chunks = tl.arange(0, BLOCK_CHUNKS)
    is_node = nodes < num_nodes
    chunk_max = tl.load(chunk_max_ptr + nodes[:, None] * num_chunks + chunks[None, :],
                        mask=is_node[:, None] & (chunks < num_chunks)[None, :], other=-float("inf"))
    best_chunk = tl.argmax(chunk_max, 1, tie_break_left=True)  # [BLOCK_NODES]
    target_argmax = tl.load(chunk_argmax_ptr + nodes * num_chunks + best_chunk, mask=is_node, other=-1)
    tokens = tl.load(tokens_ptr + nodes, mask=is_node, other=-1)
    parents = tl.load(parents_ptr + nodes, mask=is_node, other=-2)  # the root's -1 and padding match no node
    current = tl.full([], 0, tl.int32)  # the root
    accept_length = tl.full([], 0, tl.int64)
    tl.store(accepted_ptr, current.to(tl.int64))
    for step in tl.static_range(1, DEPTH + 1):  # a stopped walk stays stopped: `current` no longer moves
        current_argmax = tl.sum(tl.where(nodes == current, target_argmax, 0), 0)
        matching_children = (parents == current) & (tokens == current_argmax)
        lowest_child = tl.min(tl.where(matching_children, nodes, BLOCK_NODES), 0)
        found = lowest_child < BLOCK_NODES
        tl.store(accepted_ptr + step, tl.where(found, lowest_child, -1).to(tl.int64))
        accept_length += found.to(tl.int64)
        current = tl.where(found, lowest_child, current)
    tl.store(accept_length_ptr, accept_length)
    tl.store(bonus_ptr, tl.sum(tl.where(nodes == current, target_argmax, 0), 0))


def verify_greedy_triton(target_logits: torch.Tensor, tree_tokens: torch.Tensor, parents: torch.Tensor,
                         depth_limit: int, block_v: int | None = None):
    """Same contract as `verify_greedy`. `block_v` (a power of two) overrides the chunk width."""
    num_nodes, vocab = target_logits.shape
    if target_logits.stride(-1) != 1:
        target_logits = target_logits.contiguous()
    device = target_logits.device
    block_v = block_v or split_block(num_nodes, vocab, device, 1024, 8192)
    num_chunks = triton.cdiv(vocab, block_v)
    chunk_max = torch.empty(num_nodes, num_chunks, dtype=torch.float32, device=device)
    chunk_argmax = torch.empty(num_nodes, num_chunks, dtype=torch.int64, device=device)
    accepted_nodes = torch.empty(depth_limit + 1, dtype=torch.int64, device=device)
    accept_length = torch.empty(1, dtype=torch.int64, device=device)
    bonus_token = torch.empty(1, dtype=torch.int64, device=device)
    _chunk_argmax_kernel[(num_chunks, num_nodes)](target_logits, target_logits.stride(0), vocab, chunk_max,
                                                  chunk_argmax, num_chunks, BLOCK_V=block_v,
                                                  num_warps=8 if block_v >= 4096 else 4)
    _walk_kernel[(1,)](chunk_max, chunk_argmax, num_chunks, tree_tokens.contiguous(), parents.contiguous(),
                       num_nodes, accepted_nodes, accept_length, bonus_token, DEPTH=depth_limit,
                       BLOCK_NODES=next_power_of_2(num_nodes), BLOCK_CHUNKS=next_power_of_2(num_chunks),
                       num_warps=4)
    return accepted_nodes, accept_length, bonus_token
