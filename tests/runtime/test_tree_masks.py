"""The masks a cycle builds with few launches against plain references: the tree's ancestry (repeated squaring)
against a walk up the parents, and a drafter's step attention over its scratch window (`draft_attention`) against
SDPA over the whole cache with `draft_visible`'s mask."""
import pytest
import torch
import torch.nn.functional as F

from specdraft.kernels.tree_select import ancestry
from specdraft.layers.draft_cache import draft_attention, draft_visible


def _walked_ancestry(parents: list, max_depth: int) -> torch.Tensor:
    """The reference: from each node, up to max_depth steps up the parents, marking each node met."""
    reach = torch.eye(len(parents), dtype=torch.bool)
    for node in range(len(parents)):
        ancestor = parents[node]
        for _ in range(max_depth):
            if ancestor < 0:
                break
            reach[node, ancestor] = True
            ancestor = parents[ancestor]
    return reach


def _random_tree(num_nodes: int, max_depth: int, dropped: int, generator) -> list:
    """Parents of a random tree of at most max_depth levels below node 0; `dropped` nodes lose their parent (-1),
    as a tree whose selection left an ancestor out."""
    parents, depths = [-1], [0]
    for _ in range(1, num_nodes):
        choices = [i for i, depth in enumerate(depths) if depth < max_depth]
        parent = choices[int(torch.randint(len(choices), (1,), generator=generator))]
        parents.append(parent)
        depths.append(depths[parent] + 1)
    for node in torch.randperm(num_nodes - 1, generator=generator)[:dropped].tolist():
        parents[node + 1] = -1
    return parents


@pytest.mark.parametrize("max_depth", [1, 2, 3, 5, 6, 8])
@pytest.mark.parametrize("dropped", [0, 2])
def test_ancestry_equals_the_walk_up_the_parents(max_depth, dropped):
    generator = torch.Generator().manual_seed(max_depth * 10 + dropped)
    for _ in range(5):
        parents = _random_tree(24, max_depth, dropped, generator)
        reach = ancestry(torch.tensor(parents), max_depth)
        assert torch.equal(reach, _walked_ancestry(parents, max_depth)), parents


def test_a_chain_reaches_the_root_only_within_max_depth():
    parents = torch.arange(6) - 1  # 0 <- 1 <- ... <- 5
    assert torch.equal(ancestry(parents, 5)[:, 0], torch.ones(6, dtype=torch.bool))
    assert ancestry(parents, 4)[:, 0].tolist() == [True] * 5 + [False]


@pytest.mark.parametrize("kernels", ["auto", "reference"])
@pytest.mark.parametrize("root_written", [False, True])
@pytest.mark.parametrize("width", [4, 9])
def test_draft_attention_equals_sdpa_over_draft_visible(kernels, root_written, width, monkeypatch):
    monkeypatch.setenv("SPECDRAFT_KERNELS", kernels)
    generator = torch.Generator().manual_seed(width)
    num_slots, scratch, k = 40, 9, 3
    k_cache, v_cache = torch.randn(2, 2, num_slots, 16, generator=generator)  # [Hkv, S, D] each
    q = torch.randn(4, k, 16, generator=generator)  # [Hq, k, D]
    for prefix in [0, 7, num_slots - scratch]:
        prefix_len = torch.tensor([prefix])
        scratch_visible = torch.rand(k, width, generator=generator) < 0.5  # [k, W]
        scratch_visible[:, width - 1] = True  # each node sees itself (past the root)
        expected = F.scaled_dot_product_attention(
            q[None], k_cache[None], v_cache[None], enable_gqa=True,
            attn_mask=draft_visible(prefix_len, num_slots, scratch_visible, root_written))[0]
        got = draft_attention(q, k_cache, v_cache, prefix_len, scratch_visible, root_written)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
