"""`draft_input`: the EAGLE-3 midlayer's attention input, [norm(embedding of each token) ; norm(hidden)], in one
launch (the embedding's gather, both RMSNorms and the join).

Dispatch: the Triton kernel when `use_triton(hidden)`, else the reference (tests/kernels/test_draft_input.py
checks that both give the same bits).
"""
import torch

from specdraft.kernels import use_triton
from specdraft.kernels.draft_input.reference import draft_input_reference


def draft_input(tokens: torch.Tensor, embed_weight: torch.Tensor, hidden: torch.Tensor,
                embed_norm_weight: torch.Tensor, hidden_norm_weight: torch.Tensor, eps: float) -> torch.Tensor:
    """tokens [M] int64; embed_weight [V, H] (the target's embedding table); hidden [M, H]; the two norms' weights
    [H] and their eps -> [M, 2H] in hidden's dtype: [rms_norm(embed_weight[tokens]) ; rms_norm(hidden)], each with
    the weight product in float32 (the draft heads' RMSNorm)."""
    if use_triton(hidden, "draft_input"):
        from specdraft.kernels.draft_input.triton_kernel import draft_input_triton

        return draft_input_triton(tokens, embed_weight, hidden, embed_norm_weight, hidden_norm_weight, eps)
    return draft_input_reference(tokens, embed_weight, hidden, embed_norm_weight, hidden_norm_weight, eps)


__all__ = ["draft_input", "draft_input_reference"]
