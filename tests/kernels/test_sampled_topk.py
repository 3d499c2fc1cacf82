"""sampled_topk: the Triton kernels (under TRITON_INTERPRET=1 on CPU) against the reference: the same sampled child
and the same k - 1 others (ids exact), their scores and log q within float rounding; several vocabulary chunks are
forced with small `block_v`."""
import pytest
import torch

from specdraft.core.errors import SpecdraftError
from specdraft.kernels.sampled_topk import sampled_topk, sampled_topk_reference
from specdraft.kernels.sampled_topk.triton_kernel import sampled_topk_triton


def _inputs(rows: int, vocab: int, dtype: torch.dtype, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    draft_logits = (torch.randn(rows, vocab, generator=generator) * 3).to(dtype)
    d2t = torch.randint(0, 5000, (1,), generator=generator).expand(vocab).contiguous()  # one offset: ids invert
    exponential = torch.empty(rows, vocab).exponential_(generator=generator)
    return draft_logits, d2t, exponential


@pytest.mark.parametrize("rows, vocab, k, block_v, dtype, temperature", [
    (1, 300, 8, None, torch.float32, 1.0), (3, 500, 4, 128, torch.bfloat16, 1.0), (3, 37, 1, 16, torch.float32, 0.7),
    (2, 60, 16, 8, torch.float32, 1.3),  # chunks narrower than k
    (2, 16, 16, None, torch.bfloat16, 0.5),  # k == vocabulary
    (8, 200, 8, 64, torch.bfloat16, 1.0)])
def test_triton_matches_reference(rows, vocab, k, block_v, dtype, temperature):
    for seed in range(4):
        draft_logits, d2t, noise = _inputs(rows, vocab, dtype, seed)
        got = sampled_topk_triton(draft_logits, d2t, k, noise, temperature, block_v=block_v)
        want = sampled_topk_reference(draft_logits, d2t, k, noise, temperature)
        assert [t.dtype for t in got] == [torch.float32, torch.int64, torch.float32]
        torch.testing.assert_close(got[2], want[2], rtol=0, atol=1e-5)
        torch.testing.assert_close(got[0], want[0], rtol=0, atol=1e-5)
        assert torch.equal(got[1][:, 0], want[1][:, 0])  # the sampled child
        draft_ids = got[1] - d2t[0]  # tied logits (bf16) may come in either order: each id carries its own score
        torch.testing.assert_close(want[2].gather(1, draft_ids)[:, 1:], got[0][:, 1:], rtol=0, atol=1e-5)
        assert all(len(set(row)) == k for row in got[1].tolist())


def test_the_noise_picks_the_sampled_child_and_a_strided_row_is_read_through_its_stride():
    """Noise far larger on one token (an Exp(1) draw near 0) makes it the sampled child whatever its logit; rows of
    a non-contiguous view are read through their stride."""
    draft_logits, d2t, noise = _inputs(2, 256, torch.float32, seed=1)
    noise[0, 200], noise[1, 3] = 1e-30, 1e-30
    wide = torch.cat([draft_logits, draft_logits], dim=1)[:, :256]  # stride 512
    scores, ids, _ = sampled_topk(wide, d2t, 4, noise, 1.0)
    assert ids[:, 0].tolist() == [200 + int(d2t[200]), 3 + int(d2t[3])] and scores[:, 0].tolist() == [0.0, 0.0]
    assert torch.equal(ids, sampled_topk_reference(draft_logits, d2t, 4, noise, 1.0)[1])


def test_k_beyond_the_vocabulary_is_an_error():
    draft_logits, d2t, noise = _inputs(1, 8, torch.float32)
    with pytest.raises(SpecdraftError, match="k=9"):
        sampled_topk_triton(draft_logits, d2t, 9, noise, 1.0)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter computes on the NaN rows in numpy
def test_untrusted_rows_score_minus_inf_and_are_point_masses_in_both():
    """A row without a finite log-sum-exp (a NaN or +inf logit, every logit -inf) is untrusted: its k scores are
    -inf, its children draft indices 0..k-1 (the sampled one index 0) and its log q the point mass at index 0, in
    the kernels as in the reference; the other rows are as ever."""
    draft_logits, d2t, noise = _inputs(5, 256, torch.float32, seed=3)
    draft_logits[0, 17] = float("nan")
    draft_logits[1, 200] = float("inf")
    draft_logits[2] = -float("inf")
    draft_logits[3] = float("nan")
    for temperature in (1.0, 0.6):
        got = sampled_topk_triton(draft_logits, d2t, 4, noise, temperature, block_v=64)
        want = sampled_topk_reference(draft_logits, d2t, 4, noise, temperature)
        torch.testing.assert_close(got[0], want[0], rtol=0, atol=1e-5)
        assert torch.equal(got[1], want[1])
        torch.testing.assert_close(got[2], want[2], rtol=0, atol=1e-5)
        assert (got[0][:4] == -float("inf")).all() and torch.equal(got[1][:4], (torch.arange(4) + d2t[0]).expand(4, 4))
        point_mass = torch.full((256,), -float("inf"))
        point_mass[0] = 0.0
        assert all(torch.equal(row, point_mass) for row in got[2][:4])
        assert got[0][4, 0] == 0.0 and torch.isfinite(got[2][4]).all()
