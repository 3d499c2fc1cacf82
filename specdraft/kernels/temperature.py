"""The temperature scaling every sampling reference shares (tree_sample's acceptance, sampled_topk's children), so
that their softmaxes round alike."""
import torch


def scaled_logits(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits [..., V] -> logits / T for a float32 softmax (`softmax(..., dtype=torch.float32)`): at T = 1 the
    logits themselves (the softmax upcasts them: the same bits as dividing a float32 copy by 1, two launches fewer)."""
    return logits if temperature == 1.0 else logits.float() / temperature
