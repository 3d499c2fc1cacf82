"""The midlayer's attention input in one launch: one program per row gathers the token's embedding row, holds it
and the hidden row whole (a power-of-two block with a mask), and norms each as `kernels.rms_norm`'s kernel does
with the weight product in float32 (the same rounding steps, contraction into FMAs disabled at launch), writing
the two halves of the joined row. Where the unfused path took four launches (the embedding's gather, two norms,
the join), this takes one."""
import torch
import triton
import triton.language as tl

from specdraft.core.errors import SpecdraftError
from specdraft.kernels.launch import next_power_of_2
from specdraft.kernels.rounding import round_as


@triton.jit
def _normed(x32, weight_ptr, cols, in_row, hidden, eps, DTYPE: tl.constexpr):
    """x32 [BLOCK_H] float32 (exact in DTYPE) -> its RMSNorm, the weight product in float32, rounded to DTYPE."""
    mean_square = tl.div_rn(tl.sum(x32 * x32, axis=0), hidden.to(tl.float32))
    weight = tl.load(weight_ptr + cols, mask=in_row, other=0.0).to(tl.float32)
    return round_as(x32 * tl.math.rsqrt(mean_square + eps) * weight, DTYPE)


@triton.jit
def _draft_input_kernel(tokens_ptr, embed_ptr, hidden_ptr, embed_norm_ptr, hidden_norm_ptr, out_ptr, hidden_size,
                        eps, embed_stride, hidden_stride, BLOCK_H: tl.constexpr):
    dtype = out_ptr.dtype.element_ty
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_H)  # [BLOCK_H]
    in_row = cols < hidden_size
    token = tl.load(tokens_ptr + row).to(tl.int64)
    embeds = tl.load(embed_ptr + token * embed_stride + cols, mask=in_row, other=0.0).to(tl.float32)
    embeds = round_as(embeds, dtype)  # the embedding cast to the hidden states' dtype
    states = tl.load(hidden_ptr + row * hidden_stride + cols, mask=in_row, other=0.0).to(tl.float32)
    out_row = out_ptr + row * 2 * hidden_size
    tl.store(out_row + cols, _normed(embeds, embed_norm_ptr, cols, in_row, hidden_size, eps, dtype).to(dtype),
             mask=in_row)
    tl.store(out_row + hidden_size + cols,
             _normed(states, hidden_norm_ptr, cols, in_row, hidden_size, eps, dtype).to(dtype), mask=in_row)


def _check(tokens, embed_weight, hidden, embed_norm_weight, hidden_norm_weight) -> None:
    if hidden.dim() != 2 or hidden.stride(-1) != 1 or hidden.dtype not in (torch.float32, torch.bfloat16,
                                                                            torch.float16):
        raise SpecdraftError(f"draft_input: hidden must be [M, H] float32/bfloat16/float16 with a contiguous last "
                             f"dim, got {tuple(hidden.shape)} {hidden.dtype}")
    if tokens.shape != hidden.shape[:1] or tokens.dtype not in (torch.int32, torch.int64):
        raise SpecdraftError(f"draft_input: tokens must be [{hidden.shape[0]}] int32/int64, got "
                             f"{tuple(tokens.shape)} {tokens.dtype}")
    if embed_weight.dim() != 2 or embed_weight.shape[1] != hidden.shape[1] or embed_weight.stride(-1) != 1:
        raise SpecdraftError(f"draft_input: embed_weight {tuple(embed_weight.shape)} does not fit hidden "
                             f"{tuple(hidden.shape)}")
    for name, weight in (("embed_norm_weight", embed_norm_weight), ("hidden_norm_weight", hidden_norm_weight)):
        if weight.shape != hidden.shape[1:]:
            raise SpecdraftError(f"draft_input: {name} {tuple(weight.shape)} does not fit hidden {tuple(hidden.shape)}")


def draft_input_triton(tokens: torch.Tensor, embed_weight: torch.Tensor, hidden: torch.Tensor,
                       embed_norm_weight: torch.Tensor, hidden_norm_weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Same contract as `draft_input`."""
    _check(tokens, embed_weight, hidden, embed_norm_weight, hidden_norm_weight)
    rows, hidden_size = hidden.shape
    out = torch.empty(rows, 2 * hidden_size, device=hidden.device, dtype=hidden.dtype)
    block = next_power_of_2(hidden_size)
    if rows > 0:
        _draft_input_kernel[(rows,)](
            tokens, embed_weight, hidden, embed_norm_weight, hidden_norm_weight, out, hidden_size, eps,
            embed_weight.stride(0), hidden.stride(0), BLOCK_H=block,
            num_warps=4 if block <= 1024 else 8 if block <= 4096 else 16, enable_fp_fusion=False)
    return out
