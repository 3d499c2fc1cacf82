"""quant_linear: the int8 and int4 formats (round trip, packing, a short last group), the reference against a
float64 formula, and the Triton kernel (under TRITON_INTERPRET=1 on the CPU) against both: few rows (a GEMV, whole
and split along its input) and many, float32, bfloat16 and float16, with and without a bias."""
import pytest
import torch

from specdraft.core.errors import SpecdraftError
from specdraft.kernels.quant_linear import dequantize, quant_linear, quant_linear_reference, quantize
from specdraft.kernels.quant_linear.reference import unpack_int4
from specdraft.kernels.quant_linear.triton_kernel import launch_plan, quant_linear_triton

IN, OUT = 576, 72  # 576 = four int4 groups of 128 and one of 64, as SmolLM2's hidden size


def _weight(seed=0, rows=OUT, columns=IN):
    return torch.randn(rows, columns, generator=torch.Generator().manual_seed(seed)) * 0.05


def _formula(x: torch.Tensor, weight, bias) -> torch.Tensor:
    """y = x W^T + b in float64, W the exact dequantized weight (q * s (+ m) in float64)."""
    if weight.bits == 8:
        exact = weight.data.double() * weight.scales.double()[:, None]
    else:
        codes = unpack_int4(weight.data, weight.in_features).double()
        groups = torch.arange(weight.in_features) // weight.group_size
        exact = codes * weight.scales.double()[:, groups] + weight.mins.double()[:, groups]
    return x.double() @ exact.T + (0 if bias is None else bias.double())


def test_int8_round_trip_within_half_a_step():
    w = _weight()
    q = quantize(w, 8)
    assert q.data.dtype == torch.int8 and q.data.shape == (OUT, IN) and q.scales.shape == (OUT,)
    assert q.data.abs().amax(dim=1).eq(127).all()  # each row's largest weight takes the largest code
    assert ((dequantize(q) - w).abs() <= q.scales[:, None] / 2 + 1e-7).all()
    zero = quantize(torch.zeros(2, 8), 8)
    assert torch.equal(dequantize(zero), torch.zeros(2, 8))


def test_int4_round_trip_packing_and_short_last_group():
    w = _weight(columns=IN + 1)  # odd: the last byte holds one column
    q = quantize(w, 4, group_size=128)
    assert q.data.dtype == torch.uint8 and q.data.shape == (OUT, (IN + 2) // 2) and q.scales.shape == (OUT, 5)
    codes = unpack_int4(q.data, IN + 1)
    assert torch.equal(q.data[:, 3] & 15, codes[:, 6]) and torch.equal(q.data[:, 3] >> 4, codes[:, 7])
    last = w[:, 512:]  # 65 columns: the short group's scale and minimum are its own
    torch.testing.assert_close(q.mins[:, 4].float(), last.amin(dim=1), atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(q.scales[:, 4].float(), (last.amax(dim=1) - last.amin(dim=1)) / 15, atol=1e-4,
                               rtol=1e-3)
    step = q.scales.float().repeat_interleave(128, dim=1)[:, :IN + 1]
    assert ((dequantize(q) - w).abs() <= step / 2 + 2e-4).all()


@pytest.mark.parametrize("bits", [8, 4])
def test_reference_is_the_float64_formula(bits):
    q, bias = quantize(_weight(), bits), torch.randn(OUT)
    x = torch.randn(5, IN, dtype=torch.float64)
    assert quant_linear_reference(x, q, bias).dtype == torch.float64
    # the spec dequantizes in float32 and rounds once to the activations' dtype: float32's rounding, no more
    torch.testing.assert_close(quant_linear_reference(x, q, bias), _formula(x, q, bias), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows, forced, with_bias", [(1, {"splits": 3}, True), (3, {}, False), (40, {}, False),
                                                     (2, {"gemv": False, "splits": 2}, True),
                                                     (3, {"gemv": False, "swap": True}, True),
                                                     (40, {"swap": True, "splits": 2}, False)],
                         ids=["gemv-split", "gemv-rows", "dot", "dot-split", "swap", "swap-split"])
def test_triton_matches_reference_and_formula(bits, dtype, rows, forced, with_bias):
    q = quantize(_weight(), bits)
    x = torch.randn(rows, IN, generator=torch.Generator().manual_seed(1)).to(dtype)
    bias = torch.randn(OUT, generator=torch.Generator().manual_seed(2)).to(dtype) if with_bias else None
    plan = launch_plan(rows, q, x.device, **forced)
    got, expected = quant_linear_triton(x, q, bias, plan), quant_linear_reference(x, q, bias)
    exact = _formula(x, q, bias)
    assert got.dtype == dtype and got.shape == (rows, OUT)
    if dtype == torch.float32:
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got.double(), exact, rtol=1e-5, atol=1e-5)
    else:  # the same dequantized weights; the sums round apart by an output ulp at most
        ulp = torch.finfo(dtype).eps * exact.abs().clamp(min=1.0)
        assert ((got.double() - expected.double()).abs() <= ulp).all()
        assert ((got.double() - exact).abs() <= ulp + (expected.double() - exact).abs()).all()


def _nan_after(t: torch.Tensor) -> torch.Tensor:
    """t's values in a storage that goes on with NaNs: a read past its end shows in the output."""
    store = torch.full((t.numel() + 256,), float("nan"), dtype=t.dtype)
    store[:t.numel()] = t.flatten()
    return store[:t.numel()].view_as(t)


@pytest.mark.parametrize("forced", [{"splits": 3}, {"gemv": False, "splits": 3}], ids=["gemv", "dot"])
def test_int4_split_tail_reads_no_scales_past_the_input(forced):
    """Five groups in three splits of two: the last split's second step lies past the input, and reads neither the
    last row's scales nor its minima beyond their end (on a GPU, past an allocation's end: an illegal address)."""
    q = quantize(_weight(), 4)
    q = q._replace(scales=_nan_after(q.scales), mins=_nan_after(q.mins))
    x = torch.randn(2, IN, generator=torch.Generator().manual_seed(1))
    plan = launch_plan(2, q, x.device, **forced)
    assert plan.splits * plan.per_split > IN
    torch.testing.assert_close(quant_linear_triton(x, q, None, plan), quant_linear_reference(x, q),
                               rtol=1e-5, atol=1e-5)


def test_launch_plan():
    """int4: a small weight's decode step is a gemv, a large one's and many rows a dot; the input is split until
    the programs fill the GPU (32 on the CPU), each split a whole number of blocks; forced fields win."""
    cpu = torch.device("cpu")
    small, large = quantize(torch.zeros(960, 576), 4), quantize(torch.zeros(4096, 8192), 4)
    assert launch_plan(1, small, cpu)[:3] == (True, 1, 32) and launch_plan(1, small, cpu).splits == 1
    assert launch_plan(1, large, cpu)[:3] == (False, 16, 128) and launch_plan(1, large, cpu).splits == 1
    narrow = quantize(torch.zeros(64, 8192), 4)  # one block of outputs: 64 groups split in 8 parts of 8
    assert launch_plan(1, narrow, cpu)[4:6] == (8, 1024)
    assert launch_plan(40, small, cpu)[:4] == (False, 64, 32, 128)
    assert launch_plan(1, narrow, cpu, splits=3)[4:6] == (3, 2816)
    assert launch_plan(1, small, cpu, gemv=False, block_n=64, warps=8)[:3] == (False, 16, 64)
    assert launch_plan(3, quantize(torch.zeros(960, 576), 8), cpu)[:4] == (False, 16, 32, 256)


def test_dispatch_shapes_and_bad_input(monkeypatch):
    q = quantize(_weight(), 4)
    x = torch.randn(2, 3, IN)
    assert quant_linear(x, q).shape == (2, 3, OUT)
    monkeypatch.setenv("SPECDRAFT_KERNELS", "reference")
    assert torch.equal(quant_linear(x, q), quant_linear_reference(x, q))
    with pytest.raises(SpecdraftError, match="576 input columns"):
        quant_linear_triton(x[..., :100], q)
    with pytest.raises(SpecdraftError, match="groups of a power of two"):
        quant_linear_triton(x, quantize(_weight(), 4, group_size=96))
    with pytest.raises(SpecdraftError, match="8 or 4 bits"):
        quantize(_weight(), 2)


@pytest.mark.gpu
@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("rows, forced", [(1, {}), (3, {}), (7, {}), (40, {}), (128, {}), (1, {"gemv": True}),
                                          (3, {"gemv": True}), (2, {"swap": True, "gemv": False})])
def test_plans_at_llama3_8b_shapes_on_gpu(bits, rows, forced):
    """Every linear layer of a Llama-3.1-8B-shaped target (q, k, v and gate, up fused) under its default plan and
    the other kinds: the sizes where an index could pass 2^31 and where splits and block widths differ from the
    small cases."""
    device = torch.device("cuda")
    generator = torch.Generator(device=device).manual_seed(0)
    for columns, outputs in ((4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096), (4096, 128256)):
        q = quantize(torch.randn(outputs, columns, device=device, generator=generator) * 0.02, bits)
        x = torch.randn(rows, columns, device=device, generator=generator, dtype=torch.bfloat16)
        plan = launch_plan(rows, q, device, **forced)
        got, expected = quant_linear_triton(x, q, None, plan), quant_linear_reference(x, q)
        torch.cuda.synchronize()
        torch.testing.assert_close(got.float(), expected.float(), rtol=2e-2, atol=2e-2)
        del q
