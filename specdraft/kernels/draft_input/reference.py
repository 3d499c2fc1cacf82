"""The EAGLE-3 midlayer's attention input, the spec: the embeddings of the tokens and the incoming hidden states,
each through its own RMSNorm (the draft heads' rounding: the weight product in float32), joined.

    embeds = embed_weight[tokens].to(hidden.dtype)                          # [M, H]
    out = cat([rms_norm(embeds, embed_norm_weight), rms_norm(hidden, hidden_norm_weight)], dim=-1)   # [M, 2H]
"""
import torch

from specdraft.kernels.rms_norm.reference import rms_norm_reference


def draft_input_reference(tokens: torch.Tensor, embed_weight: torch.Tensor, hidden: torch.Tensor,
                          embed_norm_weight: torch.Tensor, hidden_norm_weight: torch.Tensor,
                          eps: float) -> torch.Tensor:
    """tokens [M] int64; embed_weight [V, H]; hidden [M, H]; the norms' weights [H] -> [M, 2H] in hidden's dtype."""
    embeds = embed_weight[tokens].to(hidden.dtype)  # [M, H]
    return torch.cat([rms_norm_reference(embeds, embed_norm_weight, eps, weight_in_fp32=True),
                      rms_norm_reference(hidden, hidden_norm_weight, eps, weight_in_fp32=True)], dim=-1)
