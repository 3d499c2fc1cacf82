"""grouped_experts: the reference against a float64 sum over each row's (row, expert) pairs, the Triton kernels
(under TRITON_INTERPRET=1 on CPU) against the reference, and the route launch's sorted pairs and block table
against their definition. Ids are distinct within a row and shared across rows; many experts go untouched. Every
buffer the kernels allocate starts poisoned (NaN, huge ints), so a value they read before writing shows.
Tolerances: float32 1e-5; bfloat16 2e-2 and float16 4e-3 against the reference in float32 (the kernel rounds the
activation and the output once each, in float32 between)."""
import pytest
import torch
import torch.nn.functional as F

from specdraft.core.errors import SpecdraftError
from specdraft.kernels.grouped_experts import grouped_experts, grouped_experts_reference
from specdraft.kernels.grouped_experts import triton_kernel
from specdraft.kernels.grouped_experts.triton_kernel import LaunchConfig, grouped_experts_triton, max_blocks, \
    route_pairs

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 4e-3}
POISON = {torch.int32: 1 << 30, torch.int64: 1 << 40}


@pytest.fixture
def poisoned(monkeypatch):
    """torch.empty returning NaN-filled float tensors and huge ints (a kernel's buffers, its output)."""
    empty = torch.empty

    def poisoned_empty(*args, **kwargs):
        tensor = empty(*args, **kwargs)
        return tensor.fill_(POISON.get(tensor.dtype, float("nan")))

    monkeypatch.setattr(torch, "empty", poisoned_empty)


def routing(rows: int, num_experts: int, top_k: int, generator: torch.Generator, pool: int | None = None):
    """expert_ids [N, k] int64, distinct within a row, from the first `pool` experts of a random order (all E by
    default: a small pool makes rows share experts, as a tree's siblings do), and softmax weights [N, k] float32."""
    order = torch.randperm(num_experts, generator=generator)[:pool or num_experts]
    picks = torch.stack([torch.randperm(order.numel(), generator=generator)[:top_k] for _ in range(rows)])
    weights = torch.softmax(torch.randn(rows, top_k, generator=generator), dim=-1)
    return order[picks], weights


def experts(num_experts: int, hidden_size: int, inter_size: int, generator: torch.Generator):
    """gate_up [E, 2I, H] and down [E, H, I] float32, scaled so that outputs stay near 1."""
    gate_up = torch.randn(num_experts, 2 * inter_size, hidden_size, generator=generator) / hidden_size ** 0.5
    down = torch.randn(num_experts, hidden_size, inter_size, generator=generator) / inter_size ** 0.5
    return gate_up, down


def inputs(rows, hidden_size, inter_size, num_experts, top_k, seed=0, pool=None):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(rows, hidden_size, generator=generator)
    return (hidden, *experts(num_experts, hidden_size, inter_size, generator),
            *routing(rows, num_experts, top_k, generator, pool))


def brute_force(hidden, gate_up, down, expert_ids, expert_weights) -> torch.Tensor:
    """Float64, one (row, expert) pair at a time."""
    inter_size = down.shape[2]
    out = torch.zeros(hidden.shape, dtype=torch.float64)
    for row in range(hidden.shape[0]):
        for slot in range(expert_ids.shape[1]):
            expert = int(expert_ids[row, slot])
            if not 0 <= expert < gate_up.shape[0]:
                continue
            projected = gate_up[expert].double() @ hidden[row].double()  # [2I]
            act = F.silu(projected[:inter_size]) * projected[inter_size:]
            out[row] += float(expert_weights[row, slot]) * (down[expert].double() @ act)
    return out


SHAPES = [  # rows, hidden, intermediate, experts, top-k (and a pool of experts the rows share)
    (1, 32, 16, 4, 1, None),  # a decode step, one expert
    (1, 40, 24, 128, 8, None),  # Qwen3-MoE's routing: 8 of 128, most untouched
    (7, 48, 40, 8, 2, None),  # Mixtral's: 2 of 8
    (13, 24, 20, 16, 8, None),
    (20, 36, 20, 64, 8, 10),  # a tree's siblings: 20 rows over 10 experts, more than a block each
]


@pytest.mark.parametrize("rows, hidden_size, inter_size, num_experts, top_k, pool", SHAPES)
def test_reference_is_the_definition(rows, hidden_size, inter_size, num_experts, top_k, pool):
    args = inputs(rows, hidden_size, inter_size, num_experts, top_k, seed=rows, pool=pool)
    expected = brute_force(*args)
    torch.testing.assert_close(grouped_experts_reference(*args).double(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows, hidden_size, inter_size, num_experts, top_k, pool", SHAPES)
def test_triton_matches_reference(rows, hidden_size, inter_size, num_experts, top_k, pool, dtype, poisoned):
    hidden, gate_up, down, expert_ids, expert_weights = inputs(rows, hidden_size, inter_size, num_experts, top_k,
                                                               seed=rows, pool=pool)
    hidden, gate_up, down = (t.to(dtype) for t in (hidden, gate_up, down))
    expected = grouped_experts_reference(hidden.float(), gate_up.float(), down.float(), expert_ids, expert_weights)
    got = grouped_experts_triton(hidden, gate_up, down, expert_ids, expert_weights)
    assert got.shape == (rows, hidden_size) and got.dtype == dtype
    torch.testing.assert_close(got.float(), expected, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


@pytest.mark.parametrize("config", [
    LaunchConfig(block_m=16, gate_up_n=16, down_n=16, block_k=16, warps=4, stages=2),  # several steps, a ragged one
    LaunchConfig(block_m=32, gate_up_n=32, down_n=16, block_k=32, warps=4, stages=2),
])
def test_forced_configs_many_steps_and_blocks(config, poisoned):
    """Inner steps of 16 over H = 40 and I = 24 (a partial last step each), 40 rows over a pool of 9 experts (several
    blocks an expert at 16 rows a block), int32 ids, bfloat16 routing weights."""
    hidden, gate_up, down, expert_ids, expert_weights = inputs(40, 40, 24, 32, 8, seed=3, pool=9)
    expected = brute_force(hidden, gate_up, down, expert_ids, expert_weights.bfloat16())
    got = grouped_experts_triton(hidden, gate_up, down, expert_ids.int(), expert_weights.bfloat16(), config=config)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)


def test_ids_outside_the_experts_add_nothing_and_a_repeated_id_adds_each_slot(poisoned):
    """An id of -1 or E (a slot a router left empty) contributes nothing; an id twice in a row contributes twice
    (20 pairs on expert 3 with 6 rows), in the kernel and the reference alike."""
    hidden, gate_up, down, expert_ids, expert_weights = inputs(6, 24, 16, 8, 4, seed=4)
    expert_ids[1, 0], expert_ids[4, 1], expert_ids[5] = -1, 8, -1  # row 5 routes nowhere: zeros
    expert_ids[:5, 2:] = 3
    expected = brute_force(hidden, gate_up, down, expert_ids, expert_weights)
    assert not expected[5].any()
    for implementation in (grouped_experts_reference, grouped_experts_triton):
        got = implementation(hidden, gate_up, down, expert_ids, expert_weights)
        torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows, num_experts, top_k, pool, block_m", [
    (1, 128, 8, None, 16), (9, 8, 2, None, 16), (40, 128, 8, 12, 16), (64, 128, 8, None, 32), (30, 4, 3, None, 16),
])
def test_route_sorts_pairs_by_expert_into_blocks(rows, num_experts, top_k, pool, block_m, poisoned):
    """sorted_pairs is the stable sort of the pairs by expert; the table's blocks cut each expert's run into
    consecutive pieces of block_m (the last shorter), in expert order, then rows 0 to the table's end, whose length
    the worst routing would fill."""
    expert_ids, _ = routing(rows, num_experts, top_k, torch.Generator().manual_seed(rows), pool)
    sorted_pairs, (block_expert, block_start, block_rows) = route_pairs(expert_ids, num_experts, block_m)
    assert torch.equal(sorted_pairs.long(), expert_ids.flatten().argsort(stable=True))
    counts = torch.bincount(expert_ids.flatten(), minlength=num_experts)
    starts = counts.cumsum(0) - counts
    expected = [(e, int(starts[e]) + first, min(block_m, int(counts[e]) - first))
                for e in range(num_experts) for first in range(0, int(counts[e]), block_m)]
    used = len(expected)
    assert list(zip(block_expert[:used].tolist(), block_start[:used].tolist(), block_rows[:used].tolist())) == expected
    assert not block_rows[used:].any()
    assert used <= block_expert.numel() == max_blocks(rows * top_k, num_experts, block_m)


def test_max_blocks_bounds_the_worst_routing():
    """max_blocks is reached: every expert but one gets a single pair, the last all the rest (P = 40, E = 8, 16 rows
    a block: 7 + ceil(33 / 16) = 10)."""
    expert_ids = torch.cat([torch.arange(7), torch.full((33,), 7)])[:, None]  # k = 1
    _, (_, _, block_rows) = route_pairs(expert_ids, 8, 16)
    assert max_blocks(40, 8, 16) == 10 == int((block_rows > 0).sum())


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
def test_hugging_faces_experts_compute_the_same(family):
    """Hugging Face's experts module (its gate_up_proj [E, 2I, H], gate rows first, and down_proj [E, H, I]: the
    layout grouped_experts takes) on the same weights and routing gives the reference's and the kernel's output."""
    from transformers import MixtralConfig, Qwen3MoeConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralExperts
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    if family == "qwen3_moe":
        module = Qwen3MoeExperts(Qwen3MoeConfig(hidden_size=40, moe_intermediate_size=24, num_experts=16))
    else:
        module = MixtralExperts(MixtralConfig(hidden_size=40, intermediate_size=24, num_local_experts=16))
    hidden, gate_up, down, expert_ids, expert_weights = inputs(6, 40, 24, 16, 4, seed=7)
    with torch.no_grad():
        module.gate_up_proj.copy_(gate_up)
        module.down_proj.copy_(down)
        expected = module(hidden, expert_ids, expert_weights)
    for implementation in (grouped_experts_reference, grouped_experts_triton):
        torch.testing.assert_close(implementation(hidden, gate_up, down, expert_ids, expert_weights), expected,
                                   rtol=1e-5, atol=1e-5)


def test_dispatch_and_bad_input(monkeypatch):
    args = inputs(3, 24, 16, 4, 2)
    torch.testing.assert_close(grouped_experts(*args), grouped_experts_reference(*args), rtol=1e-5, atol=1e-5)
    monkeypatch.setenv("SPECDRAFT_KERNELS", "reference")
    assert torch.equal(grouped_experts(*args), grouped_experts_reference(*args))
    hidden, gate_up, down, expert_ids, expert_weights = args
    with pytest.raises(SpecdraftError, match=r"\[E, 2I, H\]"):
        grouped_experts_triton(hidden, gate_up[:, :, :20], down, expert_ids, expert_weights)
    with pytest.raises(SpecdraftError, match="all the same"):
        grouped_experts_triton(hidden.bfloat16(), gate_up, down, expert_ids, expert_weights)
    with pytest.raises(SpecdraftError, match="int32 or int64"):
        grouped_experts_triton(hidden, gate_up, down, expert_ids.float(), expert_weights)
    with pytest.raises(SpecdraftError, match="powers of two >= 16"):
        grouped_experts_triton(hidden, gate_up, down, expert_ids, expert_weights,
                               config=triton_kernel.launch_config(6, 4, torch.float32)._replace(block_m=8))


CUDA = "cuda"


def _on_gpu(args, dtype):
    return [t.to(CUDA, dtype) if t.is_floating_point() and i < 3 else t.to(CUDA) for i, t in enumerate(args)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("rows, hidden_size, inter_size, num_experts, top_k, pool", [
    (1, 2048, 768, 128, 8, None), (8, 2048, 768, 128, 8, None), (40, 2048, 768, 128, 8, None),  # Qwen3-30B-A3B
    (64, 2048, 768, 128, 8, None), (64, 2048, 768, 128, 8, 12),  # 64 rows over 12 experts: siblings
    (16, 1000, 300, 8, 2, None),  # Mixtral's routing; H and I not multiples of the inner step
])
def test_on_gpu(rows, hidden_size, inter_size, num_experts, top_k, pool, dtype, poisoned):
    """Against the reference in float32 (TF32 off), at the runtime's shapes."""
    args = _on_gpu(inputs(rows, hidden_size, inter_size, num_experts, top_k, seed=rows, pool=pool), dtype)
    expected = grouped_experts_reference(*(t.float() if i < 3 else t for i, t in enumerate(args)))
    got = grouped_experts(*args)
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), expected, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


@pytest.mark.gpu
def test_a_rows_result_does_not_depend_on_the_other_rows():
    """On the GPU each row alone (a decode step) gives the bits it gets among 40 rows (a verify): its sums add in
    one order whatever shares its tiles. (Not under the interpreter, whose numpy matmul may sum a tile's rows in
    different orders.)"""
    hidden, gate_up, down, expert_ids, expert_weights = _on_gpu(inputs(40, 2048, 768, 128, 8, seed=6),
                                                                torch.bfloat16)
    together = grouped_experts(hidden, gate_up, down, expert_ids, expert_weights)
    for row in (0, 17, 39):
        alone = grouped_experts(hidden[row:row + 1], gate_up, down, expert_ids[row:row + 1],
                                expert_weights[row:row + 1])
        assert torch.equal(alone[0], together[row]), row


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 40])
def test_in_a_cuda_graph_each_replay_routes_anew(rows, poisoned):
    """Captured once (its buffers poisoned inside the graph, so every replay starts from NaN), replayed after the
    rows, the routing (random, then rows sharing 10 experts) and the weights changed in place: each replay's
    output is the reference's for that replay's routing."""
    generator = torch.Generator().manual_seed(rows)
    gate_up, down = (t.to(CUDA, torch.bfloat16) for t in experts(128, 2048, 768, generator))
    hidden = torch.randn(rows, 2048, generator=generator).to(CUDA, torch.bfloat16)
    expert_ids, expert_weights = (t.to(CUDA) for t in routing(rows, 128, 8, generator))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # compiles the kernels outside the capture
        grouped_experts(hidden, gate_up, down, expert_ids, expert_weights)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = grouped_experts(hidden, gate_up, down, expert_ids, expert_weights)
    for pool in (None, 10, None):
        new_ids, new_weights = routing(rows, 128, 8, generator, pool)
        hidden.copy_(torch.randn(rows, 2048, generator=generator))
        expert_ids.copy_(new_ids)
        expert_weights.copy_(new_weights)
        graph.replay()
        expected = grouped_experts_reference(hidden.float(), gate_up.float(), down.float(), expert_ids, expert_weights)
        torch.testing.assert_close(out.float(), expected, rtol=2e-2, atol=2e-2)
