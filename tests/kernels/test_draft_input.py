"""draft_input: the Triton kernel (under TRITON_INTERPRET=1 on CPU) against the reference, and the reference
against the draft head's own modules (the embedding table's rows and `layers.RMSNorm`, joined).

Half precision: the same bits. float32: within 2 ulp (the float32 sum of squares in another order; see
test_rms_norm.py)."""
import pytest
import torch

from specdraft.core.errors import SpecdraftError
from specdraft.kernels.draft_input import draft_input, draft_input_reference
from specdraft.kernels.draft_input.triton_kernel import draft_input_triton
from specdraft.layers.blocks import RMSNorm

EPS = 1e-5


def _inputs(rows, hidden, vocab, dtype, seed=0):
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (rows,), generator=generator)
    embed_weight = torch.randn(vocab, hidden, generator=generator).to(dtype)
    states = torch.randn(rows, hidden, generator=generator).mul(3).to(dtype)
    norms = [(1 + torch.randn(hidden, generator=generator) / 4).to(dtype) for _ in range(2)]
    return tokens, embed_weight, states, *norms


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows, hidden", [(1, 576), (8, 64), (3, 100)])
def test_triton_matches_reference(dtype, rows, hidden):
    inputs = _inputs(rows, hidden, 50, dtype)
    got, expected = draft_input_triton(*inputs, EPS), draft_input_reference(*inputs, EPS)
    assert got.shape == (rows, 2 * hidden) and got.dtype == dtype
    if dtype == torch.float32:
        torch.testing.assert_close(got, expected, rtol=2.5e-7, atol=1e-7)
    else:
        assert torch.equal(got, expected)


def test_reference_is_the_heads_modules_and_strided_rows_dispatch(monkeypatch):
    tokens, embed_weight, states, embed_norm_weight, hidden_norm_weight = _inputs(4, 96, 30, torch.bfloat16)
    embed, embed_norm, hidden_norm = torch.nn.Embedding(30, 96), RMSNorm(96, EPS), RMSNorm(96, EPS)
    with torch.no_grad():
        embed.weight.copy_(embed_weight.float())  # a float32 table: the row is cast to the states' dtype
        embed_norm.weight.copy_(embed_norm_weight)
        hidden_norm.weight.copy_(hidden_norm_weight)
        expected = torch.cat([embed_norm(embed(tokens).bfloat16()), hidden_norm(states)], dim=-1)
    norms = (embed_norm.weight.detach().bfloat16(), hidden_norm.weight.detach().bfloat16())
    assert torch.equal(draft_input_reference(tokens, embed.weight.detach(), states, *norms, EPS), expected)
    wide = torch.cat([states, states], dim=-1)[:, :96]  # rows with a stride of 192
    assert torch.equal(draft_input(tokens, embed.weight.detach(), wide, *norms, EPS), expected)
    monkeypatch.setenv("SPECDRAFT_KERNELS", "reference:draft_input")
    assert torch.equal(draft_input(tokens, embed.weight.detach(), wide, *norms, EPS), expected)


def test_bad_inputs_are_named():
    tokens, embed_weight, states, embed_norm_weight, hidden_norm_weight = _inputs(2, 32, 10, torch.bfloat16)
    with pytest.raises(SpecdraftError, match="tokens"):
        draft_input_triton(tokens[:1], embed_weight, states, embed_norm_weight, hidden_norm_weight, EPS)
    with pytest.raises(SpecdraftError, match="embed_weight"):
        draft_input_triton(tokens, embed_weight[:, :16], states, embed_norm_weight, hidden_norm_weight, EPS)
    with pytest.raises(SpecdraftError, match="hidden_norm_weight"):
        draft_input_triton(tokens, embed_weight, states, embed_norm_weight, hidden_norm_weight[:16], EPS)
