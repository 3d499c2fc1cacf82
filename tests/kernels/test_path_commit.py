"""commit_path: the Triton kernel (under TRITON_INTERPRET=1 on CPU) against the reference, and the reference
against the cycle's bookkeeping written out row by row."""
import pytest
import torch

from specdraft.core.errors import SpecdraftError
from specdraft.kernels.path_commit import commit_path, commit_path_reference
from specdraft.kernels.path_commit.triton_kernel import commit_path_triton


def _case(path, depth, nodes=12, width=24, layers=3, dtype=torch.bfloat16, seed=0):
    """An accepted path (node ids after the root) in a tree of `nodes` -> the kernels' arguments."""
    generator = torch.Generator().manual_seed(seed)
    accepted = torch.full((depth + 1,), -1, dtype=torch.int64)
    accepted[0] = 0
    accepted[1:len(path) + 1] = torch.tensor(path, dtype=torch.int64)
    tree_tokens = torch.randint(0, 1000, (nodes,), generator=generator)
    captured = [torch.randn(nodes, width, generator=generator).to(dtype) for _ in range(layers)]
    return dict(accepted_nodes=accepted, accept_length=torch.tensor([len(path)]), bonus=torch.tensor([777]),
                tree_tokens=tree_tokens, prefix_len=torch.tensor([40]), captured=captured)


def _expected(case):
    """The bookkeeping row by row, as the runtime means it."""
    nodes, length = case["accepted_nodes"].tolist(), int(case["accept_length"])
    prefix, bonus, tokens = int(case["prefix_len"]), int(case["bonus"]), case["tree_tokens"].tolist()
    src, after, emitted = [], [], []
    for row, node in enumerate(nodes):
        src.append(prefix + (node if row <= length else row))
        after.append(bonus if row == length or row + 1 == len(nodes) else tokens[max(nodes[row + 1], 0)])
        emitted.append(after[-1] if row <= length else -1)
    features = [layer[[max(node, 0) for node in nodes]] for layer in case["captured"]]
    return src, after, [length + 1] + emitted, features


def _check(committed, root, case):
    src, after, for_host, features = _expected(case)
    assert committed.src_slots.tolist() == src
    assert committed.next_tokens.tolist() == after
    assert committed.for_host.tolist() == for_host
    assert committed.count.tolist() == for_host[:1] and committed.emitted.tolist() == for_host[1:]
    assert len(committed.features) == len(features)
    for got, want in zip(committed.features, features):
        assert got.dtype == want.dtype and torch.equal(got, want)
    assert root.tolist() == [int(case["bonus"])]


@pytest.mark.parametrize("path, depth", [([], 5), ([3], 5), ([1, 4, 9], 5), ([2, 5, 6, 8, 11], 5), ([1], 1),
                                         ([], 0)])
@pytest.mark.parametrize("fn", [commit_path_reference, commit_path_triton], ids=["reference", "triton"])
def test_matches_the_bookkeeping(fn, path, depth):
    case = _case(path, depth)
    root = torch.zeros(1, dtype=torch.int64)
    _check(fn(**case, root=root), root, case)


@pytest.mark.parametrize("layers, dtype, width", [(0, torch.bfloat16, 8), (1, torch.float32, 576),
                                                  (4, torch.float16, 40), (6, torch.bfloat16, 24)])
def test_feature_counts_dtypes_and_widths(layers, dtype, width):
    """No layer (a drafter reading none), one (Kangaroo's exit), four (the launch's most), six (two gathered
    after the launch)."""
    case = _case([2, 7], 4, layers=layers, dtype=dtype, width=width)
    root = torch.zeros(1, dtype=torch.int64)
    _check(commit_path_triton(**case, root=root), root, case)


def test_strided_rows_and_dispatch():
    """Captured rows that are views with a longer row stride (a wider buffer's columns) gather through it."""
    case = _case([1, 3, 4], 5, layers=0)
    wide = torch.randn(12, 3, 24).to(torch.bfloat16)
    case["captured"] = [wide[:, i] for i in range(3)]  # [N, H] each, row stride 72
    root = torch.zeros(1, dtype=torch.int64)
    _check(commit_path(**case, root=root), root, case)
    mixed = dict(case, captured=[wide[:, 0], wide[:, 1].contiguous()])  # two row strides: the launch copies
    _check(commit_path_triton(**mixed, root=root), root, mixed)
    with pytest.raises(SpecdraftError, match="differ"):
        commit_path_triton(**dict(case, captured=[wide[:, 0], wide[:, 1, :12]]), root=root)
