"""adamw8bit: the fused Triton kernel (under TRITON_INTERPRET=1 on CPU) against the reference, the quantization
maps' error bounds, the optimizer against torch.optim.AdamW on a small regression (and a broken bias correction
that the same check rejects), its state_dict round trip, param groups and the memory its state takes.

The kernel gives the reference's bits (codes, scales and params), whole blocks and partial tail blocks alike.
The training checks run the reference (SPECDRAFT_KERNELS=reference: the interpreter is slow); one test runs the
optimizer through the kernel and compares the bits. `gpu`: the kernel on CUDA at a real size."""
import io

import pytest
import torch

from specdraft.core.errors import SpecdraftError
from specdraft.kernels.adamw8bit import (BLOCK, AdamW8bitFused, StepScalars, adamw8bit_step_reference,
                                         dequantized_state, moments_of, new_state, quantized_state)
from specdraft.kernels.adamw8bit import reference
from specdraft.kernels.adamw8bit.triton_kernel import adamw8bit_step_triton

BETAS = (0.9, 0.95)  # train.optimizer's betas


def _gradients(numel, steps, seed=0, device="cpu"):
    """`steps` gradients [N] whose magnitudes span five decades, a few exact zeros among them."""
    generator = torch.Generator().manual_seed(seed)
    scales = torch.logspace(-4, 1, numel)[torch.randperm(numel, generator=generator)]
    grads = [torch.randn(numel, generator=generator) * scales for _ in range(steps)]
    for grad in grads:
        grad[::97] = 0.0
    return [grad.to(device) for grad in grads]


def _run_steps(step_fn, param, quantized, grads, weight_decay=0.1):
    state = new_state(param, quantized)
    for step, grad in enumerate(grads, start=1):
        step_fn(param, grad.view_as(param), moments_of(state),
                StepScalars(lr=1e-2, beta1=BETAS[0], beta2=BETAS[1], eps=1e-8, weight_decay=weight_decay, step=step))
    return param, state


@pytest.mark.parametrize("shape", [(5000,), (256,), (3, 100), (64, 65), (4 * 4096 + 1,)])
@pytest.mark.parametrize("quantized", [True, False])
def test_triton_matches_reference(shape, quantized):
    """Several steps from zero moments: the same bits for the param and every state tensor."""
    param = torch.randn(shape)
    grads = _gradients(param.numel(), steps=4)
    expected_param, expected_state = _run_steps(adamw8bit_step_reference, param.clone(), quantized, grads)
    got_param, got_state = _run_steps(adamw8bit_step_triton, param.clone(), quantized, grads)
    assert torch.equal(got_param, expected_param)
    assert got_state.keys() == expected_state.keys()
    for key, value in expected_state.items():
        assert torch.equal(got_state[key], value), key


def test_triton_reads_a_bfloat16_gradient():
    param = torch.randn(1000)
    grads = [grad.bfloat16() for grad in _gradients(1000, steps=2)]
    expected_param, _ = _run_steps(adamw8bit_step_reference, param.clone(), True, grads)
    assert torch.equal(_run_steps(adamw8bit_step_triton, param.clone(), True, grads)[0], expected_param)


def test_first_moment_map_is_exact_at_zero_and_the_absmax_and_fine_below():
    """m's codes: zero and the block's absmax are exact; elsewhere the error is at most absmax / 127, and
    relatively at most 2 / (2c - 1) + 1 / (2c - 1)^2 for code c (about 1 / c: the square-root companding)."""
    first = _gradients(4 * BLOCK, steps=1)[0].view(-1, BLOCK)  # [NB, BLOCK]
    codes, absmax = reference.quantize_first(first)
    restored = reference.dequantize_first(codes.reshape(-1), absmax)
    error = (restored - first).abs()
    assert torch.all(restored[first == 0] == 0)
    assert torch.equal(restored.abs().amax(1), absmax)
    assert torch.all(error <= absmax[:, None] / 127 * 1.001)
    nonzero = codes != 0
    odd = 2 * codes[nonzero].abs().float() - 1
    assert torch.all(error[nonzero] <= first.abs()[nonzero] * (2 / odd + 1 / odd ** 2) * 1.001)


def test_second_moment_root_map_never_restores_zero():
    """sqrt(v)'s codes: the block max is exact and nothing restores to zero (the smallest is max / 65536), so
    a rounded-away second moment cannot blow up the step."""
    root = _gradients(4 * BLOCK, steps=1)[0].view(-1, BLOCK).abs()  # [NB, BLOCK]
    codes, root_max = reference.quantize_second_root(root)
    restored = reference.dequantize_second_root(codes.reshape(-1), root_max)
    assert torch.equal(restored.amax(1), root_max)
    assert torch.all(restored >= root_max[:, None] / 65536)
    assert torch.all((restored - root).abs() <= root_max[:, None] / 128 * 1.001)


def _regression(seed=0):
    """A teacher MLP's outputs on inputs of mixed scales, and a student of the same shape (two weights above
    the quantization threshold and not multiples of the block, two float32-state biases)."""
    torch.manual_seed(seed)
    teacher = torch.nn.Sequential(torch.nn.Linear(48, 100), torch.nn.Tanh(), torch.nn.Linear(100, 50))
    inputs = torch.randn(512, 48) * torch.logspace(-2, 0, 48)  # [512, 48]
    with torch.no_grad():
        targets = teacher(inputs)  # [512, 50]
    torch.manual_seed(seed + 1)
    student = torch.nn.Sequential(torch.nn.Linear(48, 100), torch.nn.Tanh(), torch.nn.Linear(100, 50))
    return student, inputs, targets


def _train(student, inputs, targets, optimizer, steps) -> list[float]:
    """-> the loss after each step."""
    losses = []
    for _ in range(steps):
        loss = torch.nn.functional.mse_loss(student(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses


CHECKPOINTS = (10, 30, 100, 300)


def _against_adamw() -> tuple[list[float], float]:
    """-> (loss / AdamW's after each of CHECKPOINTS steps, distance of the final weights from AdamW's / the
    distance AdamW moved them)."""
    settings = dict(lr=3e-3, betas=BETAS, weight_decay=0.01)
    runs = []
    for optimizer_class in (torch.optim.AdamW, AdamW8bitFused):
        student, inputs, targets = _regression()
        start = torch.cat([p.detach().reshape(-1).clone() for p in student.parameters()])
        losses = _train(student, inputs, targets, optimizer_class(student.parameters(), **settings), CHECKPOINTS[-1])
        runs.append(([losses[step - 1] for step in CHECKPOINTS],
                     torch.cat([p.detach().reshape(-1) for p in student.parameters()])))
    (adamw_losses, adamw_weights), (losses, weights) = runs
    ratios = [loss / adamw_loss for loss, adamw_loss in zip(losses, adamw_losses)]
    return ratios, float((weights - adamw_weights).norm() / (adamw_weights - start).norm())


def _tracks_adamw(loss_ratios: list[float], distance: float) -> bool:
    return all(0.9 < ratio < 1.1 for ratio in loss_ratios) and distance < 0.25


def test_optimizer_trains_as_torch_adamw_does(monkeypatch):
    """300 steps: the loss within 10% of AdamW's all along (within 3% here) and the final weights about 0.15 of
    AdamW's displacement away from AdamW's (a linear int8 m doubles that distance; a linear 8-bit v that
    restores zeros diverges)."""
    monkeypatch.setenv("SPECDRAFT_KERNELS", "reference")
    loss_ratios, distance = _against_adamw()
    assert _tracks_adamw(loss_ratios, distance), (loss_ratios, distance)


@pytest.mark.parametrize("broken", [(1.0, 1.0), "first only", "second only"])
def test_a_wrong_bias_correction_fails_the_same_check(monkeypatch, broken):
    """The check above rejects an update without (part of) the bias correction: its loss is off by 29% to 4x
    after 10 steps (the distance at 300 steps alone would not tell: beta2 = 0.95 forgets the start)."""
    monkeypatch.setenv("SPECDRAFT_KERNELS", "reference")
    right = reference.bias_corrections
    wrong = {"first only": lambda step, b1, b2: (right(step, b1, b2)[0], 1.0),
             "second only": lambda step, b1, b2: (1.0, right(step, b1, b2)[1])}.get(broken, lambda *_: broken)
    monkeypatch.setattr(reference, "bias_corrections", wrong)
    assert not _tracks_adamw(*_against_adamw())


def _snapshot(student, optimizer):
    return [p.detach().clone() for p in student.parameters()], \
        {id_: {k: v.clone() for k, v in s.items()} for id_, s in optimizer.state_dict()["state"].items()}


def test_optimizer_through_the_kernel_gives_the_reference_bits(monkeypatch):
    results = []
    for kernels in ("auto", "reference"):
        monkeypatch.setenv("SPECDRAFT_KERNELS", kernels)
        student, inputs, targets = _regression()
        optimizer = AdamW8bitFused(student.parameters(), lr=3e-3, betas=BETAS, weight_decay=0.01)
        _train(student, inputs, targets, optimizer, steps=3)
        results.append(_snapshot(student, optimizer))
    (kernel_params, kernel_state), (reference_params, reference_state) = results
    assert all(torch.equal(a, b) for a, b in zip(kernel_params, reference_params))
    for index, state in reference_state.items():
        assert all(torch.equal(kernel_state[index][k], v) for k, v in state.items())


def _grouped_optimizer(student):
    """Weights in one group, biases in another with their own lr and no weight decay."""
    weights = [p for name, p in student.named_parameters() if name.endswith("weight")]
    biases = [p for name, p in student.named_parameters() if name.endswith("bias")]
    return AdamW8bitFused([{"params": weights}, {"params": biases, "lr": 1e-3, "weight_decay": 0.0}],
                          lr=3e-3, betas=BETAS, weight_decay=0.01)


def test_state_dict_round_trip_resumes_exactly():
    """5 steps, a save (torch.save, loaded with weights_only=True) and 5 more steps on a fresh model and
    optimizer give the bits of 10 uninterrupted steps; param groups keep their settings."""
    student, inputs, targets = _regression()
    optimizer = _grouped_optimizer(student)
    _train(student, inputs, targets, optimizer, steps=5)
    buffer = io.BytesIO()
    torch.save({"model": student.state_dict(), "optimizer": optimizer.state_dict()}, buffer)
    _train(student, inputs, targets, optimizer, steps=5)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    resumed, _, _ = _regression(seed=7)
    resumed.load_state_dict(saved["model"])
    resumed_optimizer = _grouped_optimizer(resumed)
    resumed_optimizer.load_state_dict(saved["optimizer"])
    _train(resumed, inputs, targets, resumed_optimizer, steps=5)
    assert all(torch.equal(a, b) for a, b in zip(resumed.parameters(), student.parameters()))
    assert [g["lr"] for g in resumed_optimizer.param_groups] == [3e-3, 1e-3]
    resumed_state = resumed_optimizer.state[resumed[0].weight]
    assert int(resumed_state["step"]) == 10 and resumed_state["exp_avg_codes"].dtype == torch.int8


def test_a_group_with_zero_lr_is_left_alone():
    student, inputs, targets = _regression()
    weights = [p for p in student.parameters() if p.dim() == 2]
    biases = [p for p in student.parameters() if p.dim() == 1]
    before = [p.detach().clone() for p in biases]
    optimizer = AdamW8bitFused([{"params": weights}, {"params": biases, "lr": 0.0}], lr=3e-3, weight_decay=0.1)
    _train(student, inputs, targets, optimizer, steps=2)
    assert all(torch.equal(a, b) for a, b in zip(biases, before))


def test_state_is_8_bit_codes_and_block_scales():
    """2 bytes per element and 8 per block of 256 above the threshold (4096 elements); float32 m, v below it."""
    big, at_threshold, small = (torch.nn.Parameter(torch.randn(shape)) for shape in [(100, 50), (4096,), (4095,)])
    optimizer = AdamW8bitFused([big, at_threshold, small])
    for param in (big, at_threshold, small):
        param.grad = torch.randn_like(param)
    optimizer.step()
    for param in (big, at_threshold):
        state = optimizer.state[param]
        assert state["exp_avg_codes"].dtype == torch.int8 and state["exp_avg_sq_root_codes"].dtype == torch.uint8
        blocks = -(-param.numel() // BLOCK)
        assert state["exp_avg_absmax"].shape == state["exp_avg_sq_root_max"].shape == (blocks,)
        state_bytes = sum(v.numel() * v.element_size() for k, v in state.items() if k != "step")
        assert state_bytes == 2 * param.numel() + 8 * blocks <= 2.04 * param.numel()
    assert {k: v.dtype for k, v in optimizer.state[small].items() if k != "step"} == \
        {"exp_avg": torch.float32, "exp_avg_sq": torch.float32}


def test_moments_as_float32_and_back_are_the_same_bits(monkeypatch):
    """What a DeepSpeed universal checkpoint carries (float32 exp_avg, exp_avg_sq) and back, converted a chunk at a
    time (a chunk of 2 blocks here, the tail a partial block): the same codes and scales."""
    import specdraft.kernels.adamw8bit as adamw8bit

    monkeypatch.setattr(adamw8bit, "CONVERT_CHUNK", 2 * BLOCK)
    weight = torch.nn.Parameter(torch.randn(5 * BLOCK + 37))
    optimizer = AdamW8bitFused([weight], lr=1e-2, min_quantized_numel=64)
    for _ in range(3):
        weight.grad = torch.randn_like(weight) * torch.rand_like(weight) ** 4  # moments of many magnitudes
        optimizer.step()
    state = optimizer.state[weight]
    plain = dequantized_state(state)
    assert set(plain) == {"step", "exp_avg", "exp_avg_sq"} and plain["exp_avg"].shape == weight.shape
    again = quantized_state(plain)
    assert set(again) == set(state) and all(torch.equal(again[key], state[key]) for key in state)


def test_torch_adamw_state_loads_as_8_bit_moments():
    """A checkpoint of torch's AdamW (train.optimizer=adamw, the default before auto) resumes under AdamW8bitFused:
    its moments quantized (those of tensors under the threshold kept float32), its groups given this optimizer's
    settings, and the next step taken."""
    student, inputs, targets = _regression()
    adamw = torch.optim.AdamW(student.parameters(), lr=1e-3)
    _train(student, inputs, targets, adamw, steps=2)
    optimizer = AdamW8bitFused(student.parameters(), lr=1e-3, min_quantized_numel=64)
    optimizer.load_state_dict(adamw.state_dict())
    for param in student.parameters():
        assert ("exp_avg_codes" in optimizer.state[param]) == (param.numel() >= 64), param.shape
    assert optimizer.param_groups[0]["min_quantized_numel"] == 64
    _train(student, inputs, targets, optimizer, steps=1)
    assert int(optimizer.state[next(student.parameters())]["step"]) == 3


def test_bad_inputs_are_named():
    with pytest.raises(SpecdraftError, match="betas"):
        AdamW8bitFused([torch.nn.Parameter(torch.zeros(2))], betas=(0.9, 1.0))
    param = torch.nn.Parameter(torch.zeros(5000, dtype=torch.bfloat16))
    param.grad = torch.zeros_like(param)
    for step_fn in (adamw8bit_step_reference, adamw8bit_step_triton):
        with pytest.raises(SpecdraftError, match="contiguous float32, got torch.bfloat16"):
            step_fn(param, param.grad, moments_of(new_state(param, True)), StepScalars(1e-3, 0.9, 0.95, 1e-8, 0.0, 1))


@pytest.mark.gpu
@pytest.mark.parametrize("numel", [4096 * 1031 + 77, 58_720_256])
def test_triton_on_cuda_matches_reference(numel):
    """A real size on CUDA (the second an EAGLE-3 MLP weight at Llama-3.1-8B widths): codes within one step,
    scales and params within float32 rounding (IEEE sqrt and division on both sides: expected to be exact)."""
    param = torch.randn(numel, device="cuda")
    grads = _gradients(numel, steps=3, device="cuda")
    expected_param, expected_state = _run_steps(adamw8bit_step_reference, param.clone(), True, grads)
    got_param, got_state = _run_steps(adamw8bit_step_triton, param.clone(), True, grads)
    torch.testing.assert_close(got_param, expected_param, rtol=1e-6, atol=1e-7)
    for key in ("exp_avg_codes", "exp_avg_sq_root_codes"):
        assert (got_state[key].int() - expected_state[key].int()).abs().max() <= 1, key
    for key in ("exp_avg_absmax", "exp_avg_sq_root_max"):
        torch.testing.assert_close(got_state[key], expected_state[key], rtol=1e-6, atol=0)
