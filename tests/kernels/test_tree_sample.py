"""tree_sample.verify_sampled: the Triton kernels (under TRITON_INTERPRET=1 on CPU) against the reference on random
trees, with point-mass and sampled drafts, a draft vocabulary smaller than the target's, padding, several
vocabulary chunks and every depth limit: the same path and the same bonus for the same uniforms."""
import pytest
import torch

from specdraft.kernels.tree_sample import verify_sampled, verify_sampled_reference
from specdraft.kernels.tree_sample.triton_kernel import draft_index, verify_sampled_triton
from tests.kernels.trees import random_parents

VOCAB, DRAFT_VOCAB = 40, 24


def _depths(parents: torch.Tensor) -> torch.Tensor:
    depths = torch.zeros_like(parents)
    for node in range(1, parents.shape[0]):
        depths[node] = depths[parents[node]] + 1 if parents[node] >= 0 else 1
    return depths


def _case(seed: int, drafts: bool, d2t: torch.Tensor):
    """A random tree (node 5 padding when there are more than 6 nodes), logits peaked enough that some children
    pass, and with `drafts` each node's first child sampled from its q -> verify_sampled's arguments."""
    generator = torch.Generator().manual_seed(seed)
    parents = random_parents(int(torch.randint(2, 14, (), generator=generator)), generator)
    n = parents.shape[0]
    if n > 6:
        parents = torch.where((torch.arange(n) == 5) | (parents == 5), -1, parents)  # padding: no node's child
    draft_targets = torch.arange(DRAFT_VOCAB) + d2t  # [Vd]
    tokens = draft_targets[torch.randint(0, DRAFT_VOCAB, (n,), generator=generator)]
    tokens[::3] = torch.randint(0, VOCAB, (len(tokens[::3]),), generator=generator)  # some outside the draft's
    logits = torch.randn(n, VOCAB, generator=generator) * 2
    logits[parents.clamp(min=0), tokens] += 3.0 * (parents >= 0)
    case = dict(target_logits=logits.to(torch.bfloat16), tokens=tokens, parents=parents, depths=_depths(parents),
                uniforms=torch.rand(n + 1, generator=generator))
    if drafts:
        first_child = torch.tensor([node > 0 and int(parents[node]) >= 0 and
                                    int(parents[node]) not in parents[1:node].tolist() for node in range(n)])
        rows = torch.where(torch.rand(n, generator=generator) < 0.8, torch.arange(n), -1)
        logprobs = torch.log_softmax(logits.float()[:, :DRAFT_VOCAB] + torch.randn(n, DRAFT_VOCAB, generator=generator),
                                     -1)
        case.update(rows=rows, logprobs=logprobs, d2t=d2t, sampled=first_child)
    return case


@pytest.mark.parametrize("drafts", [False, True], ids=["point_mass", "sampled"])
@pytest.mark.parametrize("block_v, temperature", [(8, 0.7), (64, 1.0)])
def test_the_kernels_take_the_references_path_and_bonus(drafts, block_v, temperature):
    d2t = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(1))[:DRAFT_VOCAB].sort().values
    d2t = d2t - torch.arange(DRAFT_VOCAB)
    accepted_any = 0
    for seed in range(8):
        case = _case(seed, drafts, d2t)
        for depth_limit in range(0, int(case["depths"].max()) + 1):
            want = verify_sampled_reference(**case, depth_limit=depth_limit, temperature=temperature)
            extra = {k: case.get(k) for k in ("rows", "logprobs", "d2t", "sampled")}
            got = verify_sampled_triton(case["target_logits"], case["tokens"], case["parents"], case["uniforms"],
                                        depth_limit, temperature, **extra, block_v=block_v)
            for g, w in zip(got, want):
                assert g.dtype == w.dtype == torch.int64 and g.tolist() == w.tolist(), (seed, depth_limit)
            accepted_any += int(want[1])
    assert accepted_any > 3  # the cases walk: paths, not just bonuses, are compared


def test_the_dispatch_runs_the_kernels_under_the_interpreter_and_the_draft_index_is_built_once():
    d2t = torch.arange(DRAFT_VOCAB) * 0 + 3
    case = _case(3, True, d2t)
    want = verify_sampled_reference(**case, depth_limit=3, temperature=1.0)
    assert [t.tolist() for t in verify_sampled(**case, depth_limit=3, temperature=1.0)] == [t.tolist() for t in want]
    index = draft_index(d2t, VOCAB)
    assert index is draft_index(d2t, VOCAB)  # one tensor a d2t: a CUDA graph reads it at one address
    assert index.tolist() == [-1] * 3 + list(range(DRAFT_VOCAB)) + [-1] * (VOCAB - 3 - DRAFT_VOCAB)

