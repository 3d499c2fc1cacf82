"""A cycle's commit bookkeeping in one launch: one program per path row computes its cache slot, the token after
it and what the host reads, and gathers its captured features (up to `MAX_FEATURES` layers in the launch; a
draft reading more gathers the rest with `index_select`). Replaces about 14 launches a cycle (the clamp, the
masks, the slots' add, the token gathers, two joins, the root's copy and one gather per captured layer)."""
import torch
import triton
import triton.language as tl

from specdraft.core.errors import SpecdraftError
from specdraft.kernels.launch import next_power_of_2
from specdraft.kernels.path_commit.reference import CommittedPath

MAX_FEATURES = 4


@triton.jit
def _copy_row(src_ptr, src_stride, dst_ptr, dst_stride, node, row, width, BLOCK_H: tl.constexpr):
    cols = tl.arange(0, BLOCK_H)
    values = tl.load(src_ptr + node * src_stride + cols, mask=cols < width)
    tl.store(dst_ptr + row * dst_stride + cols, values, mask=cols < width)


@triton.jit
def _commit_kernel(nodes_ptr, accept_ptr, bonus_ptr, tokens_ptr, prefix_ptr, root_ptr, src_ptr, next_ptr,
                   host_ptr, f0_ptr, f1_ptr, f2_ptr, f3_ptr, o0_ptr, o1_ptr, o2_ptr, o3_ptr, f_stride, o_stride,
                   width, ROWS: tl.constexpr, NUM_FEATURES: tl.constexpr, BLOCK_H: tl.constexpr):
    row = tl.program_id(0)
    accept_length = tl.load(accept_ptr)
    bonus = tl.load(bonus_ptr)
    valid = row <= accept_length  # row < count
    node = tl.maximum(tl.load(nodes_ptr + row), 0)
    tl.store(src_ptr + row, tl.load(prefix_ptr) + tl.where(valid, node, row))
    has_child = row + 1 < ROWS
    child = tl.maximum(tl.load(nodes_ptr + row + 1, mask=has_child, other=0), 0)
    after = tl.where(has_child, tl.load(tokens_ptr + child), bonus)
    next_token = tl.where(row == accept_length, bonus, after)
    tl.store(next_ptr + row, next_token)
    tl.store(host_ptr + 1 + row, tl.where(valid, next_token, -1))
    tl.store(host_ptr, accept_length + 1, mask=row == 0)
    tl.store(root_ptr, bonus, mask=row == 0)
    if NUM_FEATURES > 0:
        _copy_row(f0_ptr, f_stride, o0_ptr, o_stride, node, row, width, BLOCK_H)
    if NUM_FEATURES > 1:
        _copy_row(f1_ptr, f_stride, o1_ptr, o_stride, node, row, width, BLOCK_H)
    if NUM_FEATURES > 2:
        _copy_row(f2_ptr, f_stride, o2_ptr, o_stride, node, row, width, BLOCK_H)
    if NUM_FEATURES > 3:
        _copy_row(f3_ptr, f_stride, o3_ptr, o_stride, node, row, width, BLOCK_H)


def commit_path_triton(accepted_nodes: torch.Tensor, accept_length: torch.Tensor, bonus: torch.Tensor,
                       tree_tokens: torch.Tensor, prefix_len: torch.Tensor, captured, root: torch.Tensor
                       ) -> CommittedPath:
    """The reference's contract (reference.py). The captured layers share one shape and dtype."""
    rows, device = accepted_nodes.shape[0], accepted_nodes.device
    src_slots = torch.empty(rows, dtype=torch.int64, device=device)
    next_tokens = torch.empty(rows, dtype=torch.int64, device=device)
    for_host = torch.empty(rows + 1, dtype=torch.int64, device=device)
    layers = [layer if layer.stride(-1) == 1 else layer.contiguous() for layer in captured]
    if len({(layer.shape, layer.dtype) for layer in layers}) > 1:
        raise SpecdraftError("commit_path: the captured layers differ in shape or dtype")
    if len({layer.stride(0) for layer in layers}) > 1:  # one row stride for the launch
        layers = [layer.contiguous() for layer in layers]
    fused = layers[:MAX_FEATURES]
    outputs = [torch.empty(rows, layer.shape[1], dtype=layer.dtype, device=device) for layer in fused]
    width = fused[0].shape[1] if fused else 1
    sources = fused + [accepted_nodes] * (MAX_FEATURES - len(fused))  # unused pointer slots
    targets = outputs + [accepted_nodes] * (MAX_FEATURES - len(fused))
    _commit_kernel[(rows,)](accepted_nodes.contiguous(), accept_length, bonus, tree_tokens.contiguous(), prefix_len,
                            root, src_slots, next_tokens, for_host, *sources, *targets,
                            fused[0].stride(0) if fused else 0, width, width, ROWS=rows, NUM_FEATURES=len(fused),
                            BLOCK_H=next_power_of_2(width), num_warps=4)
    rest = tuple(layer.index_select(0, accepted_nodes.clamp(min=0)) for layer in layers[MAX_FEATURES:])
    return CommittedPath(src_slots, next_tokens, for_host, tuple(outputs) + rest)
