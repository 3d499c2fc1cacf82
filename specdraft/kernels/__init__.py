"""Fused and chunked ops, each beside a plain PyTorch reference that is its spec.

Each op lives in `kernels/<op>/`: `reference.py` (the spec, short, shape comments), the fast version, and an
`__init__.py` exposing one function that dispatches. `SPECDRAFT_KERNELS=reference` forces the references.
"""
import os


def use_reference() -> bool:
    """True when SPECDRAFT_KERNELS=reference asks every op for its reference implementation."""
    return os.environ.get("SPECDRAFT_KERNELS", "auto") == "reference"
