"""Chunked soft cross-entropy against its reference: loss and gradient, float32 and bfloat16. CPU."""
import pytest
import torch

from specdraft.kernels.soft_ce import soft_cross_entropy, soft_cross_entropy_reference


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("rows, chunk_rows", [(37, 8), (16, 16), (5, 64)])
def test_chunked_matches_reference(dtype, tol, rows, chunk_rows):
    vocab = 300
    draft_ref = (torch.randn(rows, vocab) * 3).to(dtype).requires_grad_()
    draft_new = draft_ref.detach().clone().requires_grad_()
    target_logits = (torch.randn(rows, vocab) * 3).to(dtype)
    weights = (torch.rand(rows) > 0.3).float()
    loss_ref = soft_cross_entropy_reference(draft_ref, target_logits, weights)
    loss_new = soft_cross_entropy(draft_new, target_logits, weights, chunk_rows=chunk_rows)
    torch.testing.assert_close(loss_new, loss_ref, rtol=tol, atol=tol)
    (loss_ref * 0.7).backward()
    (loss_new * 0.7).backward()
    assert draft_new.grad.dtype == dtype
    torch.testing.assert_close(draft_new.grad.float(), draft_ref.grad.float(), rtol=tol, atol=tol)
    assert torch.all(draft_new.grad[weights == 0] == 0)


def test_reference_is_cross_entropy_for_one_hot_targets():
    draft_logits = torch.randn(4, 10)
    labels = torch.tensor([1, 5, 0, 9])
    one_hot_logits = torch.full((4, 10), -1e4).scatter(1, labels[:, None], 0.0)
    expected = torch.nn.functional.cross_entropy(draft_logits, labels, reduction="sum")
    torch.testing.assert_close(soft_cross_entropy_reference(draft_logits, one_hot_logits, torch.ones(4)), expected)
