"""silu(gate) * up in one launch (gate and up may be the two halves of one fused projection): programs over
(row, column block), silu in float32 as gate / (1 + exp(-gate)) (division rounded to nearest, as PyTorch's),
rounded to the storage dtype, then the product rounded (PyTorch's two ops' rounding). exp is `tl.exp` (the
GPU's fast ex2.approx; numpy's under the interpreter), so the float32 silu may differ from PyTorch's by an ulp
or two, which the half-precision rounding hides except where a value sits at a rounding boundary."""
import torch
import triton
import triton.language as tl

from specdraft.core.errors import SpecdraftError
from specdraft.kernels.launch import next_power_of_2
from specdraft.kernels.rounding import round_as


@triton.jit
def _silu_mul_kernel(gate_ptr, up_ptr, out_ptr, width, gate_stride, up_stride, BLOCK: tl.constexpr):
    dtype = out_ptr.dtype.element_ty
    row, block = tl.program_id(0).to(tl.int64), tl.program_id(1)
    cols = block * BLOCK + tl.arange(0, BLOCK)  # [BLOCK]
    in_row = cols < width
    gate = tl.load(gate_ptr + row * gate_stride + cols, mask=in_row, other=0.0).to(tl.float32)
    up = tl.load(up_ptr + row * up_stride + cols, mask=in_row, other=0.0).to(tl.float32)
    silu = round_as(tl.div_rn(gate, 1.0 + tl.exp(-gate)), dtype)
    tl.store(out_ptr + row * width + cols, round_as(silu * up, dtype).to(dtype), mask=in_row)


def silu_mul_triton(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Same contract as `silu_mul`."""
    if gate.shape != up.shape or gate.dtype != up.dtype or gate.dtype not in (torch.float32, torch.bfloat16,
                                                                              torch.float16) \
            or gate.stride(-1) != 1 or up.stride(-1) != 1:
        raise SpecdraftError(f"silu_mul: gate {tuple(gate.shape)} {gate.dtype} and up {tuple(up.shape)} {up.dtype} "
                             "must be float tensors of one shape and dtype with a contiguous last dim")
    width = gate.shape[-1]
    gate_rows, up_rows = gate.reshape(-1, width), up.reshape(-1, width)  # [R, I] (views where strides allow)
    out = torch.empty(gate.shape, device=gate.device, dtype=gate.dtype)
    block = min(next_power_of_2(width), 1024)
    if gate_rows.shape[0] > 0 and width > 0:
        _silu_mul_kernel[(gate_rows.shape[0], triton.cdiv(width, block))](
            gate_rows, up_rows, out, width, gate_rows.stride(0), up_rows.stride(0), BLOCK=block, num_warps=4,
            enable_fp_fusion=False)
    return out
