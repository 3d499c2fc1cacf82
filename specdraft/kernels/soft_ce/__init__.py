"""`soft_cross_entropy`: sum_n w_n * CE(softmax(target_n), draft_n) over rows of logits.

The target side gets no gradient (a frozen teacher). Dispatch (`impl="auto"`): the Triton kernel (kernel.py)
on CUDA tensors where `use_triton` allows it, the chunked version otherwise, the reference when
SPECDRAFT_KERNELS=reference. Tests name an implementation to run the Triton kernel on the CPU under
TRITON_INTERPRET=1 (slow: small shapes only). All of them compute the same function
(tests/kernels/test_soft_ce.py).
"""
import torch

from specdraft.core.errors import choices_error
from specdraft.kernels import use_reference, use_triton
from specdraft.kernels.soft_ce.chunked import ChunkedSoftCrossEntropy
from specdraft.kernels.soft_ce.reference import soft_cross_entropy_reference

IMPLS = ("auto", "reference", "chunked", "triton")


def _pick(impl: str, draft_logits: torch.Tensor) -> str:
    if impl not in IMPLS:
        raise choices_error("soft_cross_entropy impl", impl, IMPLS)
    if impl != "auto":
        return impl
    if use_reference("soft_ce"):
        return "reference"
    return "triton" if draft_logits.is_cuda and use_triton(draft_logits, "soft_ce") else "chunked"


def soft_cross_entropy(draft_logits: torch.Tensor, target_logits: torch.Tensor, row_weights: torch.Tensor,
                       chunk_rows: int = 4096, impl: str = "auto") -> torch.Tensor:
    """draft_logits, target_logits [N, V] (any float dtype); row_weights [N] -> float32 scalar.

    `chunk_rows` applies to the chunked version only."""
    target_logits, row_weights = target_logits.detach(), row_weights.detach()
    chosen = _pick(impl, draft_logits)
    if chosen == "reference":
        return soft_cross_entropy_reference(draft_logits, target_logits, row_weights)
    if chosen == "triton":
        from specdraft.kernels.soft_ce.kernel import TritonSoftCrossEntropy

        return TritonSoftCrossEntropy.apply(draft_logits, target_logits, row_weights)
    return ChunkedSoftCrossEntropy.apply(draft_logits, target_logits, row_weights, chunk_rows)


__all__ = ["IMPLS", "soft_cross_entropy", "soft_cross_entropy_reference"]
