"""Soft cross-entropy implementations against the reference: loss and gradient, float32 and bfloat16.

CPU: the chunked version, and the Triton kernel under TRITON_INTERPRET=1 (small shapes: the interpreter runs
each row in Python). `gpu`: the Triton kernel on CUDA at a real size."""
import pytest
import torch

from specdraft.kernels.soft_ce import soft_cross_entropy, soft_cross_entropy_reference

TOLERANCES = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def _inputs(rows, vocab, dtype, device="cpu"):
    draft_logits = (torch.randn(rows, vocab, device=device) * 3).to(dtype)
    target_logits = (torch.randn(rows, vocab, device=device) * 3).to(dtype)
    weights = (torch.rand(rows, device=device) > 0.3).float() * torch.rand(rows, device=device)
    return draft_logits, target_logits, weights


def _compare(impl, draft_logits, target_logits, weights, **kwargs):
    tol = TOLERANCES[draft_logits.dtype]
    draft_ref = draft_logits.clone().requires_grad_()
    draft_new = draft_logits.clone().requires_grad_()
    loss_ref = soft_cross_entropy_reference(draft_ref, target_logits, weights)
    loss_new = soft_cross_entropy(draft_new, target_logits, weights, impl=impl, **kwargs)
    assert loss_new.dtype == torch.float32
    torch.testing.assert_close(loss_new, loss_ref, rtol=tol, atol=tol)
    (loss_ref * 0.7).backward()
    (loss_new * 0.7).backward()
    assert draft_new.grad.dtype == draft_logits.dtype
    torch.testing.assert_close(draft_new.grad.float(), draft_ref.grad.float(), rtol=tol, atol=tol)
    assert torch.all(draft_new.grad[weights == 0] == 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows, chunk_rows", [(37, 8), (16, 16), (5, 64)])
def test_chunked_matches_reference(dtype, rows, chunk_rows):
    _compare("chunked", *_inputs(rows, 300, dtype), chunk_rows=chunk_rows)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows, vocab", [(13, 300), (3, 9000)])  # one partial block; three blocks of 4096
def test_triton_matches_reference(dtype, rows, vocab):
    _compare("triton", *_inputs(rows, vocab, dtype))


def test_triton_reads_strided_rows_of_a_larger_buffer():
    """The EAGLE-3 loss passes the teacher as a window of a padded buffer, and a draft with a row stride."""
    draft_logits, _, weights = _inputs(6, 200, torch.float32)
    teacher_buffer = torch.randn(9, 200) * 3
    padded_draft = torch.randn(6, 256)
    padded_draft[:, :200] = draft_logits
    draft_view = padded_draft[:, :200].clone().requires_grad_()
    loss = soft_cross_entropy(draft_view, teacher_buffer[2:8], weights, impl="triton")
    expected = soft_cross_entropy_reference(draft_logits, teacher_buffer[2:8], weights)
    torch.testing.assert_close(loss, expected)
    strided = padded_draft.requires_grad_()[:, :200]
    torch.testing.assert_close(soft_cross_entropy(strided, teacher_buffer[2:8], weights, impl="triton"), expected)


def test_triton_without_grad_and_with_masked_vocabulary():
    draft_logits, target_logits, weights = _inputs(3, 5000, torch.float32)
    target_logits[:, :4500] = float("-inf")  # a teacher that rules tokens out (the whole first block)
    with torch.no_grad():
        loss = soft_cross_entropy(draft_logits, target_logits, weights, impl="triton")
    torch.testing.assert_close(loss, soft_cross_entropy_reference(draft_logits, target_logits, weights))


def test_unknown_impl_names_the_valid_ones():
    from specdraft.core.errors import SpecdraftError

    with pytest.raises(SpecdraftError, match="auto, reference, chunked, triton"):
        soft_cross_entropy(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1), impl="fast")


def test_reference_is_cross_entropy_for_one_hot_targets():
    draft_logits = torch.randn(4, 10)
    labels = torch.tensor([1, 5, 0, 9])
    one_hot_logits = torch.full((4, 10), -1e4).scatter(1, labels[:, None], 0.0)
    expected = torch.nn.functional.cross_entropy(draft_logits, labels, reduction="sum")
    torch.testing.assert_close(soft_cross_entropy_reference(draft_logits, one_hot_logits, torch.ones(4)), expected)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_on_cuda_at_eagle3_size(dtype):
    _compare("triton", *_inputs(2048, 32000, dtype, device="cuda"))
    assert soft_cross_entropy(*_inputs(4, 32000, dtype, device="cuda")).device.type == "cuda"
