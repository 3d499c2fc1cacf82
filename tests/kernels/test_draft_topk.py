"""draft_topk: the Triton kernel (under TRITON_INTERPRET=1 on CPU) against its reference, and the reference
against the definition. Several vocabulary chunks are forced with small `block_v`."""
import pytest
import torch

from specdraft.core.errors import SpecdraftError
from specdraft.kernels.draft_topk import draft_topk, draft_topk_reference
from specdraft.kernels.draft_topk.triton_kernel import draft_topk_triton


def _inputs(rows: int, vocab: int, dtype: torch.dtype, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    draft_logits = (torch.randn(rows, vocab, generator=generator) * 4).to(dtype)
    d2t = torch.randint(0, 5000, (vocab,), generator=generator)
    return draft_logits, d2t


def _assert_same(got, expected):
    torch.testing.assert_close(got[0], expected[0], rtol=0, atol=1e-5)
    assert got[0].dtype == torch.float32 and got[1].dtype == torch.int64
    assert torch.equal(got[1], expected[1])


@pytest.mark.parametrize("rows, vocab, k, block_v, dtype", [
    (1, 300, 8, None, torch.float32), (3, 500, 16, 128, torch.float32), (3, 37, 1, 16, torch.float32),
    (2, 60, 16, 8, torch.float32),  # chunks narrower than k
    (2, 16, 16, None, torch.float32),  # k == vocabulary
    (3, 500, 10, 128, torch.bfloat16), (2, 300, 4, 64, torch.float16)])
def test_triton_matches_reference(rows, vocab, k, block_v, dtype):
    draft_logits, d2t = _inputs(rows, vocab, dtype)
    _assert_same(draft_topk_triton(draft_logits, d2t, k, block_v=block_v), draft_topk_reference(draft_logits, d2t, k))


def test_ties_and_masked_vocabulary():
    """Equal logits across chunks keep the lower draft index first; -inf entries (a masked vocabulary, a whole
    chunk of it) never beat finite ones; rows of a non-contiguous view are read through their stride."""
    draft_logits, d2t = _inputs(3, 256, torch.float32, seed=1)
    draft_logits[0, [3, 70, 130, 200]] = 50.0  # four-way tie at the top, in four chunks of 64
    draft_logits[1, 64:128] = -float("inf")
    draft_logits[2, :] = 0.5  # every logit equal
    draft_logits[2, 255] = -float("inf")
    got = draft_topk_triton(draft_logits, d2t, 6, block_v=64)
    _assert_same(got, draft_topk_reference(draft_logits, d2t, 6))
    assert torch.equal(got[1][0, :4], torch.tensor([3, 70, 130, 200]) + d2t[[3, 70, 130, 200]])
    assert torch.equal(got[1][2], torch.arange(6) + d2t[:6])
    wide = torch.randn(4, 512)
    _assert_same(draft_topk_triton(wide[:, ::2], d2t, 5, block_v=32), draft_topk_reference(wide[:, ::2], d2t, 5))


def test_reference_is_the_definition():
    draft_logits, d2t = _inputs(4, 50, torch.float32)
    logprobs, target_ids = draft_topk_reference(draft_logits, d2t, 5)
    full = torch.log_softmax(draft_logits, dim=-1)
    for row in range(4):
        order = sorted(range(50), key=lambda i: (-full[row, i].item(), i))[:5]
        assert target_ids[row].tolist() == [i + int(d2t[i]) for i in order]
        torch.testing.assert_close(logprobs[row], full[row, order])


def test_dispatch_and_bad_k():
    draft_logits, d2t = _inputs(2, 40, torch.float32)
    _assert_same(draft_topk(draft_logits, d2t, 4), draft_topk_reference(draft_logits, d2t, 4))
    with pytest.raises(SpecdraftError, match="k=41"):
        draft_topk_triton(draft_logits, d2t, 41)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter computes on the NaN rows in numpy
def test_untrusted_rows_score_minus_inf_in_both():
    """A row without a finite log-sum-exp (a NaN or +inf logit, every logit -inf) is untrusted: its k scores are
    -inf and its ids those of draft indices 0..k-1, in the kernel as in the reference; the other rows are as
    ever."""
    draft_logits, d2t = _inputs(5, 256, torch.float32, seed=2)
    draft_logits[0, 17] = float("nan")
    draft_logits[1, 200] = float("inf")
    draft_logits[2] = -float("inf")
    draft_logits[3] = float("nan")
    got = draft_topk_triton(draft_logits, d2t, 4, block_v=64)
    _assert_same(got, draft_topk_reference(draft_logits, d2t, 4))
    assert (got[0][:4] == -float("inf")).all() and torch.equal(got[1][:4], (torch.arange(4) + d2t[:4]).expand(4, 4))
    _assert_same((got[0][4:], got[1][4:]), draft_topk_reference(draft_logits[4:], d2t, 4))
    assert torch.isfinite(got[0][4]).all()
