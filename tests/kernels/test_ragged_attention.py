"""ragged_attention: the Triton kernels (under TRITON_INTERPRET=1 on CPU) against the reference, and the reference
against a float64 softmax written out query by query. Sequences lie end to end in one cache; the slots of other
sequences and those past a query's length hold huge values that must never be seen. Small `block_s` and
`split_size` force several key blocks and splits."""
import math

import pytest
import torch

from specdraft.core.errors import SpecdraftError
from specdraft.kernels.ragged_attention import ragged_attention, ragged_attention_reference
from specdraft.kernels.ragged_attention.triton_kernel import ragged_attention_triton, split_size_for


def _inputs(q_heads, kv_heads, rows, row_len, head_dim, dtype, queries_per_row, seed=0):
    """Rows of `row_len` slots; queries at random lengths in random rows; stale slots poisoned."""
    generator = torch.Generator().manual_seed(seed)
    row = torch.randint(0, rows, (rows * queries_per_row,), generator=generator)
    lengths = torch.randint(1, row_len + 1, row.shape, generator=generator)
    k_cache = torch.randn(kv_heads, rows * row_len, head_dim, generator=generator)
    v_cache = torch.randn(kv_heads, rows * row_len, head_dim, generator=generator)
    seen = torch.zeros(rows * row_len, dtype=torch.bool)
    for r, length in zip(row.tolist(), lengths.tolist()):
        seen[r * row_len:r * row_len + length] = True
    k_cache[:, ~seen], v_cache[:, ~seen] = 1e4, 1e4  # a single leak dominates the softmax
    q = torch.randn(q_heads, row.shape[0], head_dim, generator=generator)
    return q.to(dtype), k_cache.to(dtype), v_cache.to(dtype), row * row_len, lengths


def _slow_attention(q, k_cache, v_cache, starts, lengths, scale):
    """Float64, one query at a time over its own slots."""
    group = q.shape[0] // k_cache.shape[0]
    out = torch.zeros(q.shape, dtype=torch.float64)
    for i, (start, length) in enumerate(zip(starts.tolist(), lengths.tolist())):
        for head in range(q.shape[0]):
            keys = k_cache[head // group, start:start + length].double()
            values = v_cache[head // group, start:start + length].double()
            out[head, i] = torch.softmax(keys @ q[head, i].double() * scale, dim=0) @ values
    return out


TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


@pytest.mark.parametrize("q_heads, kv_heads, rows, row_len, head_dim, dtype, block_s, split_size", [
    (3, 1, 4, 40, 16, torch.float32, 16, 16),  # SmolLM2's group of 3, several splits
    (4, 2, 3, 64, 16, torch.float32, 16, None),
    (6, 2, 2, 48, 16, torch.bfloat16, 16, 32),
    (2, 1, 3, 33, 24, torch.float16, 16, None),  # head dim not a power of two, odd row length
])
def test_triton_matches_reference_and_definition(q_heads, kv_heads, rows, row_len, head_dim, dtype, block_s,
                                                 split_size):
    q, k_cache, v_cache, starts, lengths = _inputs(q_heads, kv_heads, rows, row_len, head_dim, dtype, 3)
    scale = 1 / math.sqrt(head_dim)
    expected = _slow_attention(q.float(), k_cache.float(), v_cache.float(), starts, lengths, scale)
    reference = ragged_attention_reference(q, k_cache, v_cache, starts, lengths, scale)
    got = ragged_attention_triton(q, k_cache, v_cache, starts, lengths, scale, row_len, block_s=block_s,
                                  split_size=split_size)
    assert got.shape == q.shape and got.dtype == dtype and got.transpose(0, 1).is_contiguous()
    for result in (reference, got):
        torch.testing.assert_close(result.double(), expected, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


def test_a_packed_prefill_is_causal_within_each_prompt():
    """Two prompts packed as one query list, each token seeing its prompt's slots up to itself: the same as
    causal attention over each prompt alone."""
    generator = torch.Generator().manual_seed(3)
    k_cache, v_cache = torch.randn(2, 1, 2 * 16, 8, generator=generator)
    q = torch.randn(2, 5 + 7, 8, generator=generator)
    starts = torch.tensor([0] * 5 + [16] * 7)
    lengths = torch.tensor(list(range(1, 6)) + list(range(1, 8)))
    got = ragged_attention(q, k_cache, v_cache, starts, lengths, 0.3, max_length=16)
    for prompt, (start, n) in enumerate([(0, 5), (16, 7)]):
        queries = slice(0, 5) if prompt == 0 else slice(5, 12)
        expected = torch.nn.functional.scaled_dot_product_attention(
            q[None, :, queries], k_cache[None, :, start:start + n].expand(1, 2, n, 8),
            v_cache[None, :, start:start + n].expand(1, 2, n, 8), is_causal=True, scale=0.3)[0]
        torch.testing.assert_close(got[:, queries], expected, rtol=1e-5, atol=1e-5)


def test_split_size_covers_the_longest_sequence():
    for queries, max_length in [(1, 2304), (256, 2304), (8, 100), (3000, 50)]:
        size = split_size_for(queries, 3, max_length, torch.device("cpu"), 64)
        assert size % 64 == 0 and -(-max_length // size) <= 64


def test_mismatched_shapes_are_one_line_errors():
    q = torch.randn(3, 2, 8)
    with pytest.raises(SpecdraftError, match=r"ragged_attention: q \(3, 2, 8\), k_cache \(2, 10, 8\)"):
        ragged_attention_triton(q, torch.randn(2, 10, 8), torch.randn(2, 10, 8), torch.zeros(2, dtype=torch.long),
                                torch.ones(2, dtype=torch.long), 1.0, 10)



@pytest.mark.parametrize("sliding_window, block_s, split_size", [(5, 16, 16), (17, 16, 16), (64, 16, None)])
def test_a_sliding_window_keeps_each_querys_latest_slots(sliding_window, block_s, split_size):
    """A sliding-window layer: query i sees the last min(length, w) slots of its range (the definition, float64),
    in the reference and the kernel."""
    from specdraft.kernels.ragged_attention import window_range

    q, k_cache, v_cache, starts, lengths = _inputs(4, 2, 3, 40, 16, torch.float32, 4, seed=sliding_window)
    kept = lengths.clamp(max=sliding_window)
    expected = _slow_attention(q, k_cache, v_cache, starts + lengths - kept, kept, 0.25)
    assert not torch.allclose(expected, _slow_attention(q, k_cache, v_cache, starts, lengths, 0.25)) \
        or sliding_window >= int(lengths.max())
    dispatched = ragged_attention(q, k_cache, v_cache, starts, lengths, 0.25, 40, sliding_window=sliding_window)
    torch.testing.assert_close(dispatched.double(), expected, rtol=1e-5, atol=1e-5)
    windowed_starts, windowed_lengths, longest = window_range(starts, lengths, sliding_window, 40)
    got = ragged_attention_triton(q, k_cache, v_cache, windowed_starts, windowed_lengths, 0.25, longest,
                                  block_s=block_s, split_size=split_size)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)
