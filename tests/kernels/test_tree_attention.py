"""tree_attention: the Triton kernels (under TRITON_INTERPRET=1 on CPU) against the reference, and the
reference against a float64 softmax written out slot by slot. Small `block_s` and `split_size` force several
key blocks and splits; slots from prefix_len + N on hold huge stale values that must never be seen."""
import math

import pytest
import torch

from specdraft.core.errors import SpecdraftError
from specdraft.kernels.tree_attention import tree_attention, tree_attention_reference
from specdraft.kernels.tree_attention.triton_kernel import tree_attention_triton
from tests.kernels.trees import ancestor_mask, random_parents


def _inputs(q_heads, kv_heads, num_nodes, seq_len, head_dim, prefix_len, dtype, seed=0):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(q_heads, num_nodes, head_dim, generator=generator).to(dtype)
    k_cache = torch.randn(kv_heads, seq_len, head_dim, generator=generator)
    v_cache = torch.randn(kv_heads, seq_len, head_dim, generator=generator)
    k_cache[:, prefix_len + num_nodes:] = 1e4  # stale slots: a single leak dominates the softmax
    v_cache[:, prefix_len + num_nodes:] = 1e4
    tree_mask = ancestor_mask(random_parents(num_nodes, generator))
    return q, k_cache.to(dtype), v_cache.to(dtype), torch.tensor([prefix_len]), tree_mask


def _slow_attention(q, k_cache, v_cache, prefix_len, tree_mask, scale):
    """Float64, one query and one visible slot at a time."""
    q_heads, num_nodes, _ = q.shape
    group = q_heads // k_cache.shape[0]
    out = torch.zeros(q.shape, dtype=torch.float64)
    for head in range(q_heads):
        keys, values = k_cache[head // group].double(), v_cache[head // group].double()
        for node in range(num_nodes):
            slots = list(range(prefix_len)) + [prefix_len + j for j in range(tree_mask.shape[1]) if tree_mask[node, j]]
            weights = torch.softmax(keys[slots] @ q[head, node].double() * scale, dim=0)
            out[head, node] = weights @ values[slots]
    return out


TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


@pytest.mark.parametrize("q_heads, kv_heads, num_nodes, seq_len, head_dim, prefix_len, dtype, block_s, split_size", [
    (4, 2, 5, 64, 16, 20, torch.float32, 16, 32),
    (3, 3, 1, 100, 32, 99, torch.float32, 16, 16),  # one query over a full cache, many splits
    (6, 2, 7, 48, 16, 0, torch.bfloat16, 16, 16),  # no prefix: the tree alone
    (2, 1, 9, 80, 24, 30, torch.float16, None, None),  # head dim not a power of two
    (4, 1, 12, 40, 16, 28, torch.float32, 16, 48),  # prefix + N == S
])
def test_triton_matches_reference(q_heads, kv_heads, num_nodes, seq_len, head_dim, prefix_len, dtype, block_s,
                                  split_size):
    inputs = _inputs(q_heads, kv_heads, num_nodes, seq_len, head_dim, prefix_len, dtype)
    scale = 1 / math.sqrt(head_dim)
    expected = tree_attention_reference(*inputs, scale)
    got = tree_attention_triton(*inputs, scale, block_s=block_s, split_size=split_size)
    assert got.shape == expected.shape and got.dtype == dtype
    torch.testing.assert_close(got.float(), expected.float(), rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


@pytest.mark.parametrize("num_nodes, window, prefix_len", [(8, 49, 30), (1, 7, 0), (10, 61, 3)])
def test_a_window_wider_than_the_queries(num_nodes, window, prefix_len):
    """A drafting step's frontier (N rows) over its scratch window (W slots after the prefix), each row seeing the
    slots its mask marks: the kernel, the reference and the float64 definition agree, stale slots unseen."""
    generator = torch.Generator().manual_seed(window)
    q = torch.randn(6, num_nodes, 16, generator=generator)
    k_cache, v_cache = torch.randn(2, 2, 96, 16, generator=generator)
    k_cache[:, prefix_len + window:] = 1e4
    v_cache[:, prefix_len + window:] = 1e4
    window_mask = torch.rand(num_nodes, window, generator=generator) > 0.6
    window_mask[:, 0] = prefix_len == 0  # a row must see something: the prefix, or the window's first slot
    inputs = (q, k_cache, v_cache, torch.tensor([prefix_len]), window_mask)
    expected = _slow_attention(q, k_cache, v_cache, prefix_len, window_mask, 0.25)
    torch.testing.assert_close(tree_attention_reference(*inputs, 0.25).double(), expected, rtol=1e-5, atol=1e-5)
    got = tree_attention_triton(*inputs, 0.25, block_s=16, split_size=32)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("implementation", ["reference", "triton"])
def test_first_column_hides_the_windows_first_slots(implementation):
    """first_column=1: a drafter's unwritten root slot (prefix_len + 0) is never seen, marked or not: the same as
    the mask with its first column cleared. The slot holds huge values, so seeing it would show."""
    generator = torch.Generator().manual_seed(5)
    q = torch.randn(6, 8, 16, generator=generator)
    k_cache, v_cache = torch.randn(2, 2, 96, 16, generator=generator)
    k_cache[:, 30], v_cache[:, 30] = 1e4, 1e4
    window_mask = torch.rand(8, 41, generator=generator) > 0.5
    window_mask[:, 0] = True
    cleared = window_mask.clone()
    cleared[:, 0] = False
    prefix_len = torch.tensor([30])
    expected = _slow_attention(q, k_cache, v_cache, 30, cleared, 0.25)
    if implementation == "reference":
        got = tree_attention_reference(q, k_cache, v_cache, prefix_len, window_mask, 0.25, first_column=1)
    else:
        got = tree_attention_triton(q, k_cache, v_cache, prefix_len, window_mask, 0.25, block_s=16, split_size=32,
                                    first_column=1)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)


def test_reference_is_the_definition():
    inputs = _inputs(4, 2, 6, 32, 8, 10, torch.float32, seed=3)
    expected = _slow_attention(*inputs[:3], 10, inputs[4], 0.3)
    torch.testing.assert_close(tree_attention_reference(*inputs, 0.3).double(), expected, rtol=1e-5, atol=1e-5)


def test_64_nodes_the_ancestor_bits_limit_and_dispatch():
    inputs = _inputs(2, 1, 64, 96, 16, 20, torch.float32, seed=1)
    torch.testing.assert_close(tree_attention(*inputs, 0.25), tree_attention_reference(*inputs, 0.25),
                               rtol=1e-5, atol=1e-5)
    too_many = _inputs(1, 1, 65, 96, 16, 20, torch.float32)
    with pytest.raises(SpecdraftError, match="a window of 65 slots"):
        tree_attention_triton(*too_many, 0.25)


def test_cpu_dispatch_reads_only_the_slots_in_use(monkeypatch):
    """Eagerly on the CPU the reference attends over the slots before prefix_len + N alone (over a whole 2,048-slot
    cache plain decoding was 1.3-1.5x slower on 2 CPU cores): the same function as over the whole
    cache, whose stale slots hold huge values."""
    monkeypatch.setenv("SPECDRAFT_KERNELS", "reference")
    seen = []
    monkeypatch.setattr("specdraft.kernels.tree_attention.tree_attention_reference",
                        lambda q, k, *rest: seen.append(k.shape[1]) or tree_attention_reference(q, k, *rest))
    q, k_cache, v_cache, prefix_len, tree_mask = _inputs(6, 2, 5, 256, 8, 40, torch.float32, seed=4)
    out = tree_attention(q, k_cache, v_cache, prefix_len, tree_mask, 0.3)
    assert seen == [40 + 5]
    torch.testing.assert_close(out, tree_attention_reference(q, k_cache, v_cache, prefix_len, tree_mask, 0.3))


def _depths(parents: torch.Tensor) -> torch.Tensor:
    depths = [0] * parents.shape[0]
    for node in range(1, parents.shape[0]):
        depths[node] = depths[int(parents[node])] + 1
    return torch.tensor(depths)


def _slow_windowed(q, k_cache, v_cache, prefix_len, tree_mask, positions, scale, sliding_window):
    """Float64 by the definition: query i sees prefix slot s when s > positions[i] - w and node j (at slot
    prefix_len + j) when it is an ancestor (or i) at a position > positions[i] - w."""
    group = q.shape[0] // k_cache.shape[0]
    out = torch.zeros(q.shape, dtype=torch.float64)
    for node in range(q.shape[1]):
        low = int(positions[node]) - sliding_window
        slots = [s for s in range(prefix_len) if s > low]
        slots += [prefix_len + j for j in range(tree_mask.shape[1]) if tree_mask[node, j] and positions[j] > low]
        for head in range(q.shape[0]):
            keys, values = k_cache[head // group, slots].double(), v_cache[head // group, slots].double()
            out[head, node] = torch.softmax(keys @ q[head, node].double() * scale, dim=0) @ values
    return out


def _windowed_inputs(num_nodes, prefix_len, seed, dtype=torch.float32, seq_len=96):
    generator = torch.Generator().manual_seed(seed)
    parents = random_parents(num_nodes, generator, max_children=2)
    q = torch.randn(6, num_nodes, 16, generator=generator).to(dtype)
    k_cache, v_cache = torch.randn(2, 2, seq_len, 16, generator=generator)
    k_cache[:, prefix_len + num_nodes:] = 1e4  # stale slots: a single leak dominates the softmax
    v_cache[:, prefix_len + num_nodes:] = 1e4
    return (q, k_cache.to(dtype), v_cache.to(dtype), torch.tensor([prefix_len]), ancestor_mask(parents),
            prefix_len + _depths(parents))


@pytest.mark.parametrize("num_nodes, prefix_len, sliding_window, block_s, split_size", [
    (9, 40, 3, 16, 16),  # the window cuts the prefix and the deeper nodes' ancestors; early splits skipped
    (5, 20, 8, 16, 32),
    (1, 50, 8, 16, 16),  # plain decoding's step, past the window
    (12, 2, 4, 16, 16),  # a short prefix, every prefix slot seen by the shallow nodes
    (7, 60, 100, None, None),  # a window wider than the sequence: the tree attention's own
])
def test_sliding_windows_hide_what_lies_before_them(num_nodes, prefix_len, sliding_window, block_s, split_size):
    """A sliding-window layer's verify: the reference and the kernel equal the float64 definition."""
    q, k_cache, v_cache, prefix, tree_mask, positions = _windowed_inputs(num_nodes, prefix_len, seed=num_nodes)
    expected = _slow_windowed(q, k_cache, v_cache, prefix_len, tree_mask, positions, 0.25, sliding_window)
    reference = tree_attention_reference(q, k_cache, v_cache, prefix, tree_mask, 0.25,
                                         sliding_window=sliding_window, positions=positions)
    torch.testing.assert_close(reference.double(), expected, rtol=1e-5, atol=1e-5)
    got = tree_attention_triton(q, k_cache, v_cache, prefix, tree_mask, 0.25, block_s=block_s,
                                split_size=split_size, sliding_window=sliding_window, positions=positions)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)
    dispatched = tree_attention(q, k_cache, v_cache, prefix, tree_mask, 0.25, sliding_window=sliding_window,
                                positions=positions)
    torch.testing.assert_close(dispatched.double(), expected, rtol=1e-5, atol=1e-5)


def test_a_sliding_window_in_bfloat16():
    q, k_cache, v_cache, prefix, tree_mask, positions = _windowed_inputs(10, 33, seed=2, dtype=torch.bfloat16)
    expected = tree_attention_reference(q, k_cache, v_cache, prefix, tree_mask, 0.25, sliding_window=5,
                                        positions=positions)
    got = tree_attention_triton(q, k_cache, v_cache, prefix, tree_mask, 0.25, block_s=16, split_size=16,
                                sliding_window=5, positions=positions)
    torch.testing.assert_close(got.float(), expected.float(), rtol=2e-2, atol=2e-2)


def test_a_sliding_window_needs_positions_and_a_square_mask():
    q, k_cache, v_cache, prefix, tree_mask, positions = _windowed_inputs(4, 10, seed=1)
    with pytest.raises(SpecdraftError, match="needs its N queries' positions"):
        tree_attention_triton(q, k_cache, v_cache, prefix, tree_mask, 0.25, sliding_window=4)
    with pytest.raises(SpecdraftError, match=r"mask \(4, 6\)"):
        tree_attention_triton(q, k_cache, v_cache, prefix, torch.ones(4, 6, dtype=torch.bool), 0.25,
                              sliding_window=4, positions=positions)


@pytest.mark.parametrize("sliding_window", [None, 6])
def test_one_query_on_the_cpu_is_one_attention_over_its_slots(monkeypatch, sliding_window):
    """Plain decoding's step on the CPU (one row seeing the prefix and itself) skips the reference's mask: the same
    function over the slots in use (those of its window), stale slots unseen."""
    monkeypatch.setenv("SPECDRAFT_KERNELS", "reference")
    monkeypatch.setattr("specdraft.kernels.tree_attention.tree_attention_reference",
                        lambda *args, **kwargs: pytest.fail("the one-row step took the masked reference"))
    q, k_cache, v_cache, prefix, tree_mask, positions = _windowed_inputs(1, 40, seed=7, seq_len=128)
    expected = _slow_windowed(q, k_cache, v_cache, 40, tree_mask, positions, 0.3, sliding_window or 10 ** 6)
    got = tree_attention(q, k_cache, v_cache, prefix, tree_mask, 0.3, sliding_window=sliding_window,
                         positions=positions)
    assert got.shape == q.shape
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)
