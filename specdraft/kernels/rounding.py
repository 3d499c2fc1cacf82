"""Rounding to a storage dtype inside Triton kernels, the same on a GPU and under the interpreter.

A fused kernel reproduces a chain of PyTorch half-precision ops by computing each step in float32 and rounding it
to the storage dtype where PyTorch would (to nearest, ties to even). The interpreter's own float32 -> bfloat16
cast truncates, so bfloat16 is rounded here by integer arithmetic on the float32 bits; float16 and float32 use
the ordinary cast, which rounds to nearest even on both. `dot_operand` upcasts a bfloat16 tile for tl.dot where
the interpreter would multiply its bits as integers.
"""
import triton
import triton.language as tl


@triton.jit
def round_as(x, DTYPE: tl.constexpr):
    """x float32 -> x rounded to DTYPE (nearest, ties to even), returned as float32 (exact in DTYPE)."""
    if DTYPE == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return tl.where(x != x, x, rounded.to(tl.float32, bitcast=True))
    else:
        return x.to(DTYPE).to(tl.float32)


@triton.jit
def dot_operand(tile, UPCAST: tl.constexpr):
    """The tile as tl.dot takes it: float32 where the interpreter cannot multiply bfloat16 (it would multiply the
    bits as integers), else unchanged."""
    if UPCAST:
        return tile.to(tl.float32)
    return tile
