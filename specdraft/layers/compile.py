"""torch.compile of training's pointwise-heavy parts (train.compile): the frozen target's decoder layers and the
draft layer's work around its attention call. Eager stays the default off CUDA; a compile failure is an error
that names the key turning it off."""
from __future__ import annotations

from typing import Callable, Dict

import torch

from specdraft.core.errors import SpecdraftError

COMPILE_KEY = "train.compile"


def compile_enabled(setting: str, device) -> bool:
    """train.compile (auto, true, false) resolved for `device`: auto compiles on CUDA devices only."""
    if setting == "auto":
        return torch.device(device).type == "cuda"
    return setting == "true"


def _compile_errors() -> tuple:
    """The exception types of a failing torch.compile (Dynamo's tracing, Inductor's code generation)."""
    from torch._dynamo.exc import TorchDynamoException

    errors = [TorchDynamoException]
    try:
        from torch._inductor.exc import InductorError
        errors.append(InductorError)
    except ImportError:
        pass
    return tuple(errors)


class Compiled:
    """`fn` under torch.compile, compiled at its first call (and again for new shapes, as torch.compile does).
    A compile failure is a SpecdraftError naming `what` and COMPILE_KEY; other errors (out of memory) pass."""

    def __init__(self, fn: Callable, what: str):
        self.fn, self.what, self.compiled = fn, what, None

    def __call__(self, *args, **kwargs):
        if self.compiled is None:
            try:
                self.compiled = torch.compile(self.fn)
            except RuntimeError as err:  # torch.compile refuses this platform (its Python version, its OS)
                raise self._failure(err) from err
        try:
            return self.compiled(*args, **kwargs)
        except _compile_errors() as err:
            raise self._failure(err) from err

    def _failure(self, err: Exception) -> SpecdraftError:
        first_line = (str(err).strip().splitlines() or [""])[0][:300]
        return SpecdraftError(f"torch.compile of {self.what} failed ({type(err).__name__}: {first_line}); "
                              f"set {COMPILE_KEY}=false to run it eagerly")


_COMPILED: Dict[Callable, Compiled] = {}


def maybe_compiled(fn: Callable, enabled: bool) -> Callable:
    """`fn` itself, or (enabled) its one Compiled wrapper: every caller shares its compiled graphs."""
    if not enabled:
        return fn
    if fn not in _COMPILED:
        _COMPILED[fn] = Compiled(fn, f"{fn.__module__}.{fn.__qualname__}")
    return _COMPILED[fn]


def compile_decoder_layers(model) -> int:
    """Compile the forward of each decoder layer of a Hugging Face causal LM (regional compilation: one graph,
    reused by every layer of the same shapes). The layers' own hooks (capture_features' pre-hooks) stay outside
    the compiled code and see the same inputs. Idempotent; -> the number of layers compiled now."""
    layers = getattr(model.get_decoder(), "layers", None) or []
    compiled = 0
    for layer in layers:
        if not isinstance(layer.forward, Compiled):
            layer.forward = Compiled(layer.forward, f"the target's decoder layer ({type(layer).__name__})")
            compiled += 1
    return compiled
