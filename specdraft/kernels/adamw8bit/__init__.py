"""`adamw8bit_step`: one tensor's AdamW step from blockwise 8-bit moments, and `AdamW8bitFused`, the optimizer
around it (train.optimizer=adamw8bit_fused).

Memory is bitsandbytes' AdamW8bit's (2 bytes of moments per parameter plus two float32 scales per 256), and the
step is one fused kernel launch per tensor, bandwidth-bound: 16 bytes of traffic per parameter. reference.py
is the spec and says which quantization and why.

Dispatch: the Triton kernel when `use_triton(param)`, else the reference (tests/kernels/test_adamw8bit.py checks
that both give the same bits).
"""

import torch

from specdraft.core.errors import SpecdraftError
from specdraft.kernels import use_triton
from specdraft.kernels.adamw8bit.reference import (BLOCK, Moments, StepScalars, adamw8bit_step_reference, as_blocks,
                                                   dequantize_first, dequantize_second_root, num_blocks,
                                                   quantize_first, quantize_second_root, sqrt_rn)

MIN_QUANTIZED_NUMEL = 4096
CODE_KEYS = ("exp_avg_codes", "exp_avg_sq_root_codes")
QUANTIZED_KEYS = (*CODE_KEYS, "exp_avg_absmax", "exp_avg_sq_root_max")
CONVERT_CHUNK = BLOCK * 65536
"""Elements (whole blocks) converted at once between 8-bit and float32 moments: bounds the float64 square roots'
transient memory (CONVERT_CHUNK x 8 bytes) for a draft's flat ZeRO partition of hundreds of millions."""


def adamw8bit_step(param: torch.Tensor, grad: torch.Tensor, moments: Moments, scalars: StepScalars) -> None:
    """param [...] float32 and its moments updated in place by one AdamW step with gradient grad [...]."""
    if use_triton(param, "adamw8bit"):
        from specdraft.kernels.adamw8bit.triton_kernel import adamw8bit_step_triton

        adamw8bit_step_triton(param, grad, moments, scalars)
    else:
        adamw8bit_step_reference(param, grad, moments, scalars)


def new_state(param: torch.Tensor, quantized: bool) -> dict:
    """A param's zero moments: codes and scales (zero scales dequantize to exactly zero), or float32 m and v."""
    numel, device = param.numel(), param.device
    if not quantized:
        return {"step": torch.tensor(0.0), "exp_avg": torch.zeros(numel, device=device),
                "exp_avg_sq": torch.zeros(numel, device=device)}
    return {"step": torch.tensor(0.0),
            "exp_avg_codes": torch.zeros(numel, dtype=torch.int8, device=device),  # [N]
            "exp_avg_sq_root_codes": torch.zeros(numel, dtype=torch.uint8, device=device),  # [N]
            "exp_avg_absmax": torch.zeros(num_blocks(numel), device=device),  # [NB]
            "exp_avg_sq_root_max": torch.zeros(num_blocks(numel), device=device)}  # [NB]


def moments_of(state: dict) -> Moments:
    """A param's optimizer state (as `new_state` makes it) -> its `Moments` (views of the same tensors)."""
    if "exp_avg_codes" in state:
        return Moments(state["exp_avg_codes"], state["exp_avg_sq_root_codes"], state["exp_avg_absmax"],
                       state["exp_avg_sq_root_max"])
    return Moments(state["exp_avg"], state["exp_avg_sq"])


def dequantized_state(state: dict) -> dict:
    """A param's state with 8-bit moments as float32 exp_avg and exp_avg_sq [N], torch.optim.AdamW's keys (which
    DeepSpeed's universal checkpoints carry); a state without codes as it is."""
    if "exp_avg_codes" not in state:
        return state
    codes = state["exp_avg_codes"]
    first, second = torch.empty(codes.numel(), device=codes.device), torch.empty(codes.numel(), device=codes.device)
    for start, stop, blocks in _chunks(codes.numel()):
        values = dequantize_first(codes[start:stop], state["exp_avg_absmax"][blocks])  # [nb, BLOCK]
        first[start:stop] = values.reshape(-1)[:stop - start]
        root = dequantize_second_root(state["exp_avg_sq_root_codes"][start:stop], state["exp_avg_sq_root_max"][blocks])
        second[start:stop] = (root * root).reshape(-1)[:stop - start]
    kept = {key: value for key, value in state.items() if key not in QUANTIZED_KEYS}
    return {**kept, "exp_avg": first, "exp_avg_sq": second}


def quantized_state(state: dict) -> dict:
    """The inverse: float32 exp_avg and exp_avg_sq [N] as the 8-bit codes and scales a step keeps (`new_state`)."""
    first, second = state["exp_avg"].reshape(-1).float(), state["exp_avg_sq"].reshape(-1).float()
    codes = new_state(first, quantized=True)
    for start, stop, blocks in _chunks(first.numel()):
        first_codes, first_scales = quantize_first(as_blocks(first[start:stop]))
        root_codes, root_scales = quantize_second_root(sqrt_rn(as_blocks(second[start:stop])))
        codes["exp_avg_codes"][start:stop] = first_codes.reshape(-1)[:stop - start]
        codes["exp_avg_sq_root_codes"][start:stop] = root_codes.reshape(-1)[:stop - start]
        codes["exp_avg_absmax"][blocks], codes["exp_avg_sq_root_max"][blocks] = first_scales, root_scales
    kept = {key: value for key, value in state.items() if key not in ("exp_avg", "exp_avg_sq")}
    return {**kept, **{key: codes[key] for key in QUANTIZED_KEYS}}


def _chunks(numel: int):
    """(start, stop, their blocks as a slice) of CONVERT_CHUNK elements each, over [0, numel)."""
    for start in range(0, numel, CONVERT_CHUNK):
        stop = min(numel, start + CONVERT_CHUNK)
        yield start, stop, slice(start // BLOCK, start // BLOCK + num_blocks(stop - start))


def _check_hyperparameters(lr, betas, eps, weight_decay) -> None:
    if lr < 0 or eps < 0 or weight_decay < 0 or not all(0.0 <= beta < 1.0 for beta in betas):
        raise SpecdraftError(f"AdamW8bitFused: need lr, eps, weight_decay >= 0 and betas in [0, 1); got lr={lr}, "
                             f"betas={tuple(betas)}, eps={eps}, weight_decay={weight_decay}")


class AdamW8bitFused(torch.optim.Optimizer):
    """torch.optim.AdamW's update with 8-bit blockwise moments (reference.py) for tensors of at least
    `min_quantized_numel` elements (float32 moments below it, as bitsandbytes' min_8bit_size), one fused kernel
    per tensor on CUDA. Parameters must be float32 (the master weights of mixed precision).

    The state is per parameter, in a normal state_dict: `step` (a CPU float tensor, as torch's AdamW) and either
    exp_avg_codes int8 [N], exp_avg_absmax [NB], exp_avg_sq_root_codes uint8 [N] (codes of sqrt(v)) and
    exp_avg_sq_root_max [NB], or exp_avg and exp_avg_sq float32 [N]. Loading it resumes the same bits."""

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 1e-2,
                 min_quantized_numel: int = MIN_QUANTIZED_NUMEL):
        _check_hyperparameters(lr, betas, eps, weight_decay)
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        min_quantized_numel=min_quantized_numel)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    self._step_param(param, group)
        return loss

    def quantize_moments(self) -> int:
        """Float32 moments of tensors of min_quantized_numel elements or more (loaded from torch's AdamW, or
        from a DeepSpeed universal checkpoint) as 8-bit codes, as its steps keep them -> tensors converted."""
        converted = 0
        for group in self.param_groups:
            for param in group["params"]:
                state = self.state.get(param, {})
                if "exp_avg" in state and param.numel() >= group["min_quantized_numel"]:
                    self.state[param] = quantized_state(state)
                    converted += 1
        return converted

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's loader casts every state tensor of a float32 param to float32; the codes keep their 8-bit
        dtypes (set aside, then moved to the param's device). Float32 moments of a tensor that is quantized
        (torch's AdamW's) are quantized."""
        saved_states = state_dict["state"]
        without_codes = {index: {k: v for k, v in saved.items() if k not in CODE_KEYS}
                         for index, saved in saved_states.items()}
        super().load_state_dict({**state_dict, "state": without_codes})
        saved_ids = [index for group in state_dict["param_groups"] for index in group["params"]]
        params = [param for group in self.param_groups for param in group["params"]]
        for index, param in zip(saved_ids, params):
            for key in CODE_KEYS:
                if key in saved_states.get(index, {}):
                    self.state[param][key] = saved_states[index][key].to(param.device)
        for group in self.param_groups:  # torch's AdamW saved groups without this optimizer's own settings
            for key, value in self.defaults.items():
                group.setdefault(key, value)
        self.quantize_moments()

    def _step_param(self, param: torch.Tensor, group: dict) -> None:
        state = self.state[param]
        if not state:
            state.update(new_state(param, param.numel() >= group["min_quantized_numel"]))
        state["step"] += 1
        beta1, beta2 = group["betas"]
        scalars = StepScalars(lr=float(group["lr"]), beta1=beta1, beta2=beta2, eps=group["eps"],
                              weight_decay=group["weight_decay"], step=int(state["step"]))
        adamw8bit_step(param, param.grad, moments_of(state), scalars)


__all__ = ["BLOCK", "MIN_QUANTIZED_NUMEL", "AdamW8bitFused", "Moments", "StepScalars", "adamw8bit_step",
           "adamw8bit_step_reference", "dequantized_state", "moments_of", "new_state", "quantized_state"]
