"""silu(gate) * up in one launch: programs over (row, column block), silu in float32 as gate / (1 + exp(-gate)),
rounded to the storage dtype, then the product rounded (PyTorch's two ops' rounding). exp is the device's
(numpy's under the interpreter), so a result may differ from PyTorch's by an ulp of the float32 silu, which the
half-precision rounding hides except at rounding boundaries."""
import torch
import triton
import triton.language as tl

from specdraft.errors import SpecdraftError
from specdraft.kernels.launch import next_power_of_2
from specdraft.kernels.rounding import round_as


@triton.jit
def _silu_mul_kernel(gate_up_ptr, out_ptr, width, row_stride, BLOCK: tl.constexpr):
    dtype = out_ptr.dtype.element_ty
    row, block = tl.program_id(0).to(tl.int64), tl.program_id(1)
    cols = block * BLOCK + tl.arange(0, BLOCK)  # [BLOCK]
    in_row = cols < width
    gate = tl.load(gate_up_ptr + row * row_stride + cols, mask=in_row, other=0.0).to(tl.float32)
    up = tl.load(gate_up_ptr + row * row_stride + width + cols, mask=in_row, other=0.0).to(tl.float32)
    silu = round_as(gate / (1.0 + tl.exp(-gate)), dtype)
    tl.store(out_ptr + row * width + cols, round_as(silu * up, dtype).to(dtype), mask=in_row)


def silu_mul_triton(gate_up: torch.Tensor) -> torch.Tensor:
    """Same contract as `silu_mul`."""
    if gate_up.shape[-1] % 2 or gate_up.stride(-1) != 1 or gate_up.dtype not in (torch.float32, torch.bfloat16,
                                                                                  torch.float16):
        raise SpecdraftError(f"silu_mul: gate_up must be float with an even, contiguous last dim, got "
                             f"{tuple(gate_up.shape)} {gate_up.dtype}")
    width = gate_up.shape[-1] // 2
    rows = gate_up.reshape(-1, 2 * width)  # [R, 2I]
    out = torch.empty(*gate_up.shape[:-1], width, device=gate_up.device, dtype=gate_up.dtype)
    block = min(next_power_of_2(width), 1024)
    if rows.shape[0] > 0:
        _silu_mul_kernel[(rows.shape[0], triton.cdiv(width, block))](rows, out, width, rows.stride(0), BLOCK=block,
                                                                    num_warps=4, enable_fp_fusion=False)
    return out
