"""On a CUDA GPU: each Triton op against its reference at runtime shapes, and each op captured in a CUDA graph
and replayed after its inputs (device scalars included) changed in place."""
import pytest
import torch

from specdraft.kernels.draft_input import draft_input, draft_input_reference
from specdraft.kernels.draft_topk import draft_topk, draft_topk_reference
from specdraft.kernels.kv_compact import compact_kv, compact_kv_reference
from specdraft.kernels.path_commit import commit_path, commit_path_reference
from specdraft.kernels.rms_norm import rms_norm, rms_norm_reference
from specdraft.kernels.rope_cache import rope_cache, rope_cache_reference
from specdraft.kernels.sampled_topk import sampled_topk, sampled_topk_reference
from specdraft.kernels.silu_mul import silu_mul, silu_mul_reference
from specdraft.kernels.tree_attention import tree_attention, tree_attention_reference
from specdraft.kernels.tree_frontier import advance_frontier, advance_frontier_reference
from specdraft.kernels.tree_sample import verify_sampled, verify_sampled_reference
from specdraft.kernels.tree_select import select_tree, select_tree_reference
from specdraft.kernels.tree_verify import verify_greedy, verify_greedy_reference
from tests.kernels.trees import ancestor_mask, expansion_candidates, random_parents

pytestmark = pytest.mark.gpu
CUDA = "cuda"


def _captured(fn):
    """fn() captured in a CUDA graph (after a warm-up that compiles the kernels) -> the graph and its outputs."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = fn()
    return graph, outputs


@pytest.mark.parametrize("rows, vocab", [(1, 32000), (64, 8192), (8, 128256)])
def test_draft_topk_on_gpu_and_in_a_graph(rows, vocab):
    draft_logits = torch.randn(rows, vocab, device=CUDA).bfloat16()
    d2t = torch.randint(0, 1000, (vocab,), device=CUDA)
    graph, (logprobs, target_ids) = _captured(lambda: draft_topk(draft_logits, d2t, 10))
    for _ in range(2):
        draft_logits.copy_(torch.randn_like(draft_logits, dtype=torch.float32))
        graph.replay()
        expected = draft_topk_reference(draft_logits, d2t, 10)
        torch.testing.assert_close(logprobs, expected[0], rtol=0, atol=1e-4)
        assert torch.equal(target_ids, expected[1])


@pytest.mark.parametrize("rows, k", [(1, 8), (8, 8), (1, 1)])
def test_sampled_topk_on_gpu_and_in_a_graph(rows, k):
    """SmolLM2's draft vocabulary: the sampled child and the others as the reference draws them, log q written out."""
    draft_logits = torch.randn(rows, 8192, device=CUDA).bfloat16()
    d2t = torch.zeros(8192, dtype=torch.long, device=CUDA)
    noise, logprobs_out = torch.empty(rows, 8192, device=CUDA), torch.empty(rows, 8192, device=CUDA)
    graph, (scores, ids, _) = _captured(lambda: sampled_topk(draft_logits, d2t, k, noise, 1.0, logprobs_out))
    for _ in range(2):
        draft_logits.copy_(torch.randn_like(draft_logits, dtype=torch.float32) * 3)
        noise.exponential_()
        graph.replay()
        expected = sampled_topk_reference(draft_logits, d2t, k, noise, 1.0)
        assert torch.equal(ids[:, 0], expected[1][:, 0])
        torch.testing.assert_close(scores, expected[0], rtol=0, atol=1e-4)
        torch.testing.assert_close(logprobs_out, expected[2], rtol=0, atol=1e-4)


@pytest.mark.parametrize("drafts", [False, True], ids=["point_mass", "sampled"])
def test_verify_sampled_on_gpu_and_in_a_graph(drafts):
    """A 40-node tree over SmolLM2's vocabulary (49152, draft vocabulary 8192): the reference's path and bonus."""
    generator = torch.Generator().manual_seed(0)
    parents = random_parents(40, generator, max_children=8).to(CUDA)
    depths = torch.zeros(40, dtype=torch.long)
    for node in range(1, 40):
        depths[node] = depths[parents[node]] + 1
    tokens = torch.randint(0, 8192, (40,), generator=generator).to(CUDA)
    logits, uniforms = torch.empty(40, 49152, device=CUDA).bfloat16(), torch.empty(41, device=CUDA)
    extra = {}
    if drafts:
        first_child = torch.tensor([node > 0 and int(parents[node]) not in parents[1:node].tolist()
                                    for node in range(40)], device=CUDA)
        extra = dict(rows=torch.arange(40, device=CUDA), logprobs=torch.randn(40, 8192, device=CUDA).log_softmax(-1),
                     d2t=torch.zeros(8192, dtype=torch.long, device=CUDA), sampled=first_child)
    args = (logits, tokens, parents, depths.to(CUDA), uniforms, int(depths.max()), 1.0)
    graph, outputs = _captured(lambda: verify_sampled(*args, **extra))
    for _ in range(3):
        logits.copy_(torch.randn(40, 49152, device=CUDA) * 3)
        logits[parents.clamp(min=0), tokens] += 8.0  # children the target likes: the walk goes down
        uniforms.uniform_()
        graph.replay()
        expected = verify_sampled_reference(*args, **extra)
        assert [t.tolist() for t in outputs] == [t.tolist() for t in expected]


@pytest.mark.parametrize("k, width", [(8, 576), (10, 4096), (1, 64)])
def test_advance_frontier_on_gpu_and_in_a_graph(k, width):
    child_logprobs = torch.empty(k, k, device=CUDA)
    frontier_scores = torch.empty(k, device=CUDA)
    tokens, ids = torch.randint(0, 49152, (k, k), device=CUDA), torch.arange(1, k + 1, device=CUDA)
    hidden = torch.randn(k, width, device=CUDA).bfloat16()
    visible = torch.rand(k, 1 + 6 * k, device=CUDA) > 0.5
    args = (child_logprobs, tokens, frontier_scores, ids, 1 + k, hidden, visible)
    graph, outputs = _captured(lambda: advance_frontier(*args))
    for _ in range(2):
        child_logprobs.copy_(-torch.rand(k, k, device=CUDA) * 5)
        frontier_scores.copy_(-torch.rand(k, device=CUDA))
        graph.replay()
        for got, expected in zip(outputs, advance_frontier_reference(*args)):
            assert torch.equal(got, expected)


@pytest.mark.parametrize("depth, topk, budget", [(6, 8, 48), (6, 10, 60), (4, 1, 5)])
def test_select_tree_on_gpu_and_in_a_graph(depth, topk, budget):
    tokens, parents, scores = (t.to(CUDA) for t in expansion_candidates(depth, topk, torch.Generator().manual_seed(0)))
    graph, outputs = _captured(lambda: select_tree(tokens, parents, scores, budget, depth))
    for seed in (1, 2):
        for tensor, fresh in zip((tokens, parents, scores),
                                 expansion_candidates(depth, topk, torch.Generator().manual_seed(seed))):
            tensor.copy_(fresh)
        graph.replay()
        for got, expected in zip(outputs, select_tree_reference(tokens, parents, scores, budget, depth)):
            assert torch.equal(got, expected)


@pytest.mark.parametrize("num_nodes, vocab", [(64, 152064), (1, 49152), (20, 32000)])
def test_verify_greedy_on_gpu_and_in_a_graph(num_nodes, vocab):
    generator = torch.Generator().manual_seed(num_nodes)
    parents = random_parents(num_nodes, generator).to(CUDA)
    target_logits = torch.randn(num_nodes, vocab, device=CUDA).bfloat16()
    tree_tokens = torch.zeros(num_nodes, dtype=torch.int64, device=CUDA)
    graph, outputs = _captured(lambda: verify_greedy(target_logits, tree_tokens, parents, 8))
    for match_fraction in (0.0, 0.8, 1.0):
        target_logits.copy_(torch.randn_like(target_logits, dtype=torch.float32))
        argmax = target_logits.argmax(-1)[parents.clamp(min=0)]
        hits = torch.rand(num_nodes, device=CUDA) < match_fraction
        tree_tokens.copy_(torch.where(hits, argmax, argmax + 1))
        graph.replay()
        for got, expected in zip(outputs, verify_greedy_reference(target_logits, tree_tokens, parents, 8)):
            assert torch.equal(got, expected)


@pytest.mark.parametrize("layers, kv_heads, head_dim", [(30, 3, 64), (32, 8, 128)])
def test_compact_kv_on_gpu_and_in_a_graph(layers, kv_heads, head_dim):
    k_cache = torch.randn(layers, kv_heads, 512, head_dim, device=CUDA).bfloat16()
    v_cache = torch.randn_like(k_cache)
    src_slots = torch.zeros(8, dtype=torch.int64, device=CUDA)
    dst_start = torch.zeros(1, dtype=torch.int64, device=CUDA)
    count = torch.zeros(1, dtype=torch.int64, device=CUDA)
    graph, _ = _captured(lambda: compact_kv(k_cache, v_cache, src_slots, dst_start, count))
    for start, slots, valid in [(100, [100, 102, 103, 105, 109, 110, 111, 115], 8), (200, [201, 204, 205] + [0] * 5, 3),
                                (300, [300] * 8, 0)]:
        src_slots.copy_(torch.tensor(slots))
        dst_start.fill_(start)
        count.fill_(valid)
        expected_k, expected_v = k_cache.clone(), v_cache.clone()
        compact_kv_reference(expected_k, expected_v, src_slots, dst_start, count)
        graph.replay()
        assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)


@pytest.mark.parametrize("depth, width, layers", [(5, 576, 3), (6, 4096, 3), (4, 576, 1)])
def test_commit_path_on_gpu_and_in_a_graph(depth, width, layers):
    nodes = 48
    accepted = torch.full((depth + 1,), -1, dtype=torch.int64, device=CUDA)
    accept_length, bonus, prefix_len = (torch.zeros(1, dtype=torch.int64, device=CUDA) for _ in range(3))
    tree_tokens = torch.randint(0, 49152, (nodes,), device=CUDA)
    captured = [torch.randn(nodes, width, device=CUDA).bfloat16() for _ in range(layers)]
    root = torch.zeros(1, dtype=torch.int64, device=CUDA)
    args = (accepted, accept_length, bonus, tree_tokens, prefix_len, captured)
    graph, committed = _captured(lambda: commit_path(*args, root))
    for path, start, token in [([], 100, 5), ([3, 11, 20][:depth], 250, 17), (list(range(1, depth + 1)), 7, 9)]:
        accepted.fill_(-1)
        accepted[:len(path) + 1] = torch.tensor([0] + path)
        accept_length.fill_(len(path))
        prefix_len.fill_(start)
        bonus.fill_(token)
        expected_root = torch.zeros_like(root)
        expected = commit_path_reference(*args, expected_root)
        graph.replay()
        for got, want in zip(committed[:3] + (*committed.features,), expected[:3] + (*expected.features,)):
            assert torch.equal(got, want)
        assert torch.equal(root, expected_root)


@pytest.mark.parametrize("q_heads, kv_heads, num_nodes, head_dim", [(9, 3, 1, 64), (9, 3, 64, 64), (32, 8, 1, 128),
                                                                     (32, 8, 24, 128)])
def test_tree_attention_on_gpu_and_in_a_graph(q_heads, kv_heads, num_nodes, head_dim):
    q = torch.randn(q_heads, num_nodes, head_dim, device=CUDA).bfloat16()
    k_cache = torch.randn(kv_heads, 2048, head_dim, device=CUDA).bfloat16()
    v_cache = torch.randn_like(k_cache)
    prefix_len = torch.zeros(1, dtype=torch.int64, device=CUDA)
    tree_mask = ancestor_mask(random_parents(num_nodes, torch.Generator().manual_seed(0))).to(CUDA)
    graph, out = _captured(lambda: tree_attention(q, k_cache, v_cache, prefix_len, tree_mask, head_dim ** -0.5))
    for prefix in (0, 700, 2048 - num_nodes):
        prefix_len.fill_(prefix)
        graph.replay()
        expected = tree_attention_reference(q, k_cache, v_cache, prefix_len, tree_mask, head_dim ** -0.5)
        torch.testing.assert_close(out.float(), expected.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("first_column", [0, 1])
@pytest.mark.parametrize("num_nodes, window", [(8, 49), (1, 7), (10, 61)])
def test_tree_attention_over_a_window_on_gpu_and_in_a_graph(num_nodes, window, first_column):
    """A drafting step's shape: N frontier rows over a scratch window of W slots after the prefix (from column 1
    on: an EAGLE-3 drafter's, whose root slot is unwritten)."""
    q = torch.randn(9, num_nodes, 64, device=CUDA).bfloat16()
    k_cache = torch.randn(3, 2048, 64, device=CUDA).bfloat16()
    v_cache = torch.randn_like(k_cache)
    prefix_len = torch.zeros(1, dtype=torch.int64, device=CUDA)
    window_mask = torch.rand(num_nodes, window, device=CUDA) > 0.5
    window_mask[:, :2] = True  # with no prefix, every row still sees a slot
    graph, out = _captured(lambda: tree_attention(q, k_cache, v_cache, prefix_len, window_mask, 0.125,
                                                  first_column=first_column))
    for prefix in (0, 700, 2048 - window):
        prefix_len.fill_(prefix)
        graph.replay()
        expected = tree_attention_reference(q, k_cache, v_cache, prefix_len, window_mask, 0.125, first_column)
        torch.testing.assert_close(out.float(), expected.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("num_nodes, sliding_window", [(1, 512), (24, 512), (64, 16), (9, 4096)])
def test_tree_attention_with_a_sliding_window_on_gpu_and_in_a_graph(num_nodes, sliding_window):
    """A sliding-window layer's verify and decoding step, replayed as the prefix grows past the window."""
    parents = random_parents(num_nodes, torch.Generator().manual_seed(1))
    depths = ancestor_mask(parents).sum(1).to(CUDA) - 1  # [N]
    q = torch.randn(16, num_nodes, 128, device=CUDA).bfloat16()
    k_cache = torch.randn(8, 4096, 128, device=CUDA).bfloat16()
    v_cache = torch.randn_like(k_cache)
    prefix_len = torch.zeros(1, dtype=torch.int64, device=CUDA)
    positions = torch.zeros(num_nodes, dtype=torch.int64, device=CUDA)
    tree_mask = ancestor_mask(parents).to(CUDA)
    graph, out = _captured(lambda: tree_attention(q, k_cache, v_cache, prefix_len, tree_mask, 128 ** -0.5,
                                                  sliding_window=sliding_window, positions=positions))
    for prefix in (0, 300, 2000, 4096 - num_nodes):
        prefix_len.fill_(prefix)
        positions.copy_(prefix + depths)
        graph.replay()
        expected = tree_attention_reference(q, k_cache, v_cache, prefix_len, tree_mask, 128 ** -0.5,
                                            sliding_window=sliding_window, positions=positions)
        torch.testing.assert_close(out.float(), expected.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("sliding_window", [None, 64, 1024])
def test_ragged_attention_with_a_sliding_window_on_gpu_and_in_a_graph(sliding_window):
    from specdraft.kernels.ragged_attention import ragged_attention, ragged_attention_reference, window_range

    rows, row_len = 32, 2048
    q = torch.randn(16, rows, 128, device=CUDA).bfloat16()
    k_cache = torch.randn(8, rows * row_len, 128, device=CUDA).bfloat16()
    v_cache = torch.randn_like(k_cache)
    starts = torch.arange(rows, device=CUDA) * row_len
    lengths = torch.ones(rows, dtype=torch.int64, device=CUDA)
    graph, out = _captured(lambda: ragged_attention(q, k_cache, v_cache, starts, lengths, 128 ** -0.5, row_len,
                                                    sliding_window=sliding_window))
    for seed in range(3):
        lengths.copy_(torch.randint(1, row_len + 1, (rows,), generator=torch.Generator().manual_seed(seed)))
        graph.replay()
        seen = (starts, lengths) if sliding_window is None else window_range(starts, lengths, sliding_window,
                                                                             row_len)[:2]
        expected = ragged_attention_reference(q, k_cache, v_cache, *seen, 128 ** -0.5, row_len)
        torch.testing.assert_close(out.float(), expected.float(), rtol=2e-2, atol=2e-2)


def _within_one_bf16_step(got: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(got.float(), expected.float(), rtol=2 ** -7, atol=1e-6)


@pytest.mark.parametrize("rows, hidden", [(1, 576), (64, 576), (8, 4096)])
def test_rms_norm_on_gpu_and_in_a_graph(rows, hidden):
    """bfloat16: the reference's bits, but where the float32 sums of squares of the two reductions round apart
    (one bfloat16 step, rarely)."""
    x, residual = torch.randn(2, rows, hidden, device=CUDA).mul(3).bfloat16()
    weight = (1 + torch.randn(hidden, device=CUDA) / 4).bfloat16()
    graph, (out, summed) = _captured(lambda: rms_norm(x, weight, 1e-5, residual))
    for _ in range(2):
        x.copy_(torch.randn_like(x, dtype=torch.float32))
        graph.replay()
        expected_out, expected_summed = rms_norm_reference(x, weight, 1e-5, residual)
        assert torch.equal(summed, expected_summed)
        _within_one_bf16_step(out, expected_out)
        assert (out != expected_out).sum() <= max(1, out.numel() // 1000)


@pytest.mark.parametrize("rows, hidden, vocab", [(1, 576, 49152), (8, 576, 49152), (7, 4096, 128256)])
def test_draft_input_on_gpu_and_in_a_graph(rows, hidden, vocab):
    """bfloat16: the reference's bits, but where the two reductions' float32 sums round apart (as rms_norm's)."""
    embed_weight = torch.randn(vocab, hidden, device=CUDA).bfloat16()
    states = torch.randn(rows, hidden, device=CUDA).mul(3).bfloat16()
    tokens = torch.randint(0, vocab, (rows,), device=CUDA)
    norms = [(1 + torch.randn(hidden, device=CUDA) / 4).bfloat16() for _ in range(2)]
    graph, out = _captured(lambda: draft_input(tokens, embed_weight, states, *norms, 1e-5))
    for _ in range(2):
        tokens.copy_(torch.randint(0, vocab, (rows,), device=CUDA))
        states.copy_(torch.randn_like(states, dtype=torch.float32))
        graph.replay()
        expected = draft_input_reference(tokens, embed_weight, states, *norms, 1e-5)
        _within_one_bf16_step(out, expected)
        assert (out != expected).sum() <= max(1, out.numel() // 1000)


@pytest.mark.parametrize("shifted", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("tokens, q_heads, kv_heads, head_dim", [(1, 9, 3, 64), (64, 9, 3, 64), (8, 32, 8, 128)])
def test_rope_cache_on_gpu_and_in_a_graph(tokens, q_heads, kv_heads, head_dim, dtype, shifted):
    """The reference's bits (q, and both caches after the write); shifted: a drafting step's form (positions - 1,
    slots after a device-scalar base that changes between replays)."""
    qkv = torch.randn(tokens, (q_heads + 2 * kv_heads) * head_dim, device=CUDA).to(dtype)
    q, k, v = (t.view(tokens, -1, head_dim) for t in qkv.split([q_heads * head_dim, kv_heads * head_dim,
                                                                kv_heads * head_dim], dim=-1))
    cos, sin = torch.randn(2, 1024, head_dim, device=CUDA).to(dtype)
    k_cache, v_cache = torch.randn(2, kv_heads, 1024, head_dim, device=CUDA).to(dtype)
    positions = torch.ones(tokens, dtype=torch.int64, device=CUDA)
    slots, base = torch.zeros_like(positions), torch.zeros(1, dtype=torch.int64, device=CUDA)
    offset, slot_base = (-1, base) if shifted else (0, None)
    graph, q_rot = _captured(lambda: rope_cache(q, k, v, cos, sin, positions, k_cache, v_cache, slots, offset,
                                                slot_base))
    for start in (0, 500):
        positions.copy_(1 + torch.randperm(1023, device=CUDA)[:tokens])
        slots.copy_(torch.arange(start, start + tokens, device=CUDA))
        base.fill_(start // 2)
        expected_k, expected_v = k_cache.clone(), v_cache.clone()
        expected_q = rope_cache_reference(q, k, v, cos, sin, positions + offset, expected_k, expected_v,
                                          slots + base if shifted else slots)
        graph.replay()
        assert torch.equal(q_rot, expected_q)
        assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)


@pytest.mark.parametrize("rows, width", [(1, 1536), (64, 14336)])
def test_silu_mul_on_gpu_and_in_a_graph(rows, width):
    """bfloat16: within one step of the reference (the kernel's exp is the GPU's fast one)."""
    gate_up = torch.randn(rows, 2 * width, device=CUDA).mul(3).bfloat16()
    graph, out = _captured(lambda: silu_mul(*gate_up.chunk(2, dim=-1)))
    for _ in range(2):
        gate_up.copy_(torch.randn_like(gate_up, dtype=torch.float32).mul(3))
        graph.replay()
        expected = silu_mul_reference(*gate_up.chunk(2, dim=-1))
        _within_one_bf16_step(out, expected)
