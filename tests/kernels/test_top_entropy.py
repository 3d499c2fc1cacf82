"""top_entropy: the Triton kernel (under TRITON_INTERPRET=1 on CPU) against its reference, with ties at the M-th
logit, M at or past the vocabulary, -inf logits and strided rows; the reference against the definition."""
import math

import pytest
import torch

from specdraft.kernels.top_entropy import top_entropy, top_entropy_reference
from specdraft.kernels.top_entropy.triton_kernel import top_entropy_triton


def _logits(rows: int, vocab: int, dtype=torch.float32, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, vocab, generator=generator) * 3).to(dtype)


@pytest.mark.parametrize("rows, vocab, top, dtype", [
    (3, 300, 100, torch.float32), (2, 1000, 999, torch.float32), (4, 200, 1000, torch.float32),  # M > vocabulary
    (1, 5000, 1000, torch.float32), (3, 300, 1, torch.float32), (2, 777, 64, torch.bfloat16),
    (2, 500, 100, torch.float16)])
def test_triton_matches_reference(rows, vocab, top, dtype):
    logits = _logits(rows, vocab, dtype)
    torch.testing.assert_close(top_entropy_triton(logits, top), top_entropy_reference(logits, top), rtol=1e-5,
                               atol=1e-5)


def test_ties_at_the_cut_infinities_and_strided_rows():
    logits = _logits(4, 256, seed=1)
    logits[0, :40] = 2.0  # 40 tied logits where the top 16 end
    logits[0, 40:] = -1.0
    logits[1, 100:] = -float("inf")  # fewer finite logits than M
    logits[2, :] = 0.5  # every logit equal: the entropy of M equal ones
    wide = torch.cat([logits, torch.zeros(4, 7)], dim=1)[:, :256]  # rows read through their stride
    expected = top_entropy_reference(logits, 16)
    torch.testing.assert_close(top_entropy_triton(wide, 16), expected, rtol=1e-5, atol=1e-5)
    assert expected[2].item() == pytest.approx(math.log(16), abs=1e-5)
    assert expected[0].item() == pytest.approx(math.log(16), abs=1e-5)  # 16 of the tied, whichever


def test_reference_is_the_definition():
    logits = _logits(2, 50)
    for row in range(2):
        top = torch.softmax(logits[row], 0).sort(descending=True).values[:10]
        p = top / top.sum()
        assert top_entropy_reference(logits, 10)[row].item() == pytest.approx(-(p * p.log()).sum().item(), abs=1e-5)


def test_dispatch_follows_the_kernels_setting(monkeypatch):
    logits = _logits(2, 300)
    monkeypatch.setenv("SPECDRAFT_KERNELS", "reference")
    torch.testing.assert_close(top_entropy(logits, 30), top_entropy_reference(logits, 30))
