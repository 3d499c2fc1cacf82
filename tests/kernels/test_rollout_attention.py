"""Rollout attention (P-EAGLE's training forward over parallel-drafting rows): the dense reference against a
brute-force loop over each row's visible keys, flex attention with its block mask against the dense reference (CPU:
eager, forward only, as PyTorch runs flex there), and `gpu`: the compiled flex call, forward and backward, in
bfloat16 against the float32 reference."""
import math
import warnings

import pytest
import torch

from specdraft.core.errors import SpecdraftError
from specdraft.kernels.rollout_attention import rollout_attention, rollout_mask, rollout_visible

DOCUMENTS = [[0] * 9 + [1] * 14 + [2] * 5, [0] * 20 + [1] * 8]


@pytest.fixture(autouse=True)
def _quiet_eager_flex():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
        yield


def _rollout(batch=2, columns=28, sizes=(28, 17, 9, 4), seed=0, device="cpu"):
    """Rows as P-EAGLE lays them out: group 0 every column, group g a sorted random subset of group g - 1's
    columns -> (anchors, groups) [B, L] each."""
    generator = torch.Generator().manual_seed(seed)
    kept = torch.arange(columns).expand(batch, columns)
    anchors, groups = [kept], [torch.zeros(batch, columns, dtype=torch.long)]
    for group, size in enumerate(sizes[1:], start=1):
        pick = torch.rand(kept.shape, generator=generator).topk(size, dim=1).indices.sort(dim=1).values
        kept = kept.gather(1, pick)
        anchors.append(kept)
        groups.append(torch.full((batch, size), group, dtype=torch.long))
    return torch.cat(anchors, 1).to(device), torch.cat(groups, 1).to(device)


def _qkv(rows, batch=2, heads=4, kv_heads=2, dim=16, device="cpu", dtype=torch.float32, seed=1):
    generator = torch.Generator(device=device).manual_seed(seed)
    return [torch.randn(batch, h, rows, dim, device=device, dtype=dtype, generator=generator)
            for h in (heads, kv_heads, kv_heads)]


def _brute_force(query, key, value, anchors, groups, documents):
    """Each row's softmax over the keys it sees, by the rule written out as a loop: the prefix (group 0 at columns
    up to its own) and the rows drafted before it from its own column, within its document."""
    batch, heads, rows, dim = query.shape
    share = heads // key.shape[1]
    out = torch.zeros_like(query)
    for b in range(batch):
        for q in range(rows):
            a_q, g_q = int(anchors[b, q]), int(groups[b, q])
            seen = [k for k in range(rows)
                    if (documents is None or documents[b][int(anchors[b, k])] == documents[b][a_q])
                    and ((int(groups[b, k]) == 0 and int(anchors[b, k]) <= a_q)
                         or (int(anchors[b, k]) == a_q and int(groups[b, k]) <= g_q))]
            for h in range(heads):
                keys, values = key[b, h // share, seen], value[b, h // share, seen]  # [S, D]
                weights = torch.softmax(keys @ query[b, h, q] / math.sqrt(dim), dim=0)
                out[b, h, q] = weights @ values
    return out


@pytest.mark.parametrize("packed", [False, True])
def test_dense_reference_equals_a_brute_force_loop(packed):
    anchors, groups = _rollout()
    documents = torch.tensor(DOCUMENTS) if packed else None
    query, key, value = _qkv(anchors.shape[1])
    got = rollout_attention(query, key, value, rollout_mask(anchors, groups, documents, "dense"))
    want = _brute_force(query, key, value, anchors, groups, DOCUMENTS if packed else None)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_group_zero_is_causal_attention():
    """The columns' own rows see exactly the causal prefix: EAGLE-3's first TTT step."""
    anchors, groups = _rollout()
    visible = rollout_visible(anchors, groups)[:, 0, :28, :28]
    assert torch.equal(visible, torch.ones(28, 28, dtype=torch.bool).tril().expand(2, -1, -1))


@pytest.mark.parametrize("packed", [False, True])
def test_flex_forward_matches_dense(packed):
    anchors, groups = _rollout()
    documents = torch.tensor(DOCUMENTS) if packed else None
    query, key, value = _qkv(anchors.shape[1])
    dense = rollout_attention(query, key, value, rollout_mask(anchors, groups, documents, "dense"))
    mask = rollout_mask(anchors, groups, documents, "flex")
    assert mask.block_mask is not None and mask.visible is None
    torch.testing.assert_close(rollout_attention(query, key, value, mask), dense, rtol=1e-5, atol=1e-5)


def test_auto_is_dense_off_cuda_and_a_bad_impl_names_the_choices():
    anchors, groups = _rollout()
    assert rollout_mask(anchors, groups, None, "auto").visible is not None
    with pytest.raises(SpecdraftError, match="auto, dense, flex"):
        rollout_mask(anchors, groups, None, "sparse")


def _output_and_grads(query, key, value, mask):
    query, key, value = (t.detach().requires_grad_() for t in (query, key, value))
    out = rollout_attention(query, key, value, mask)
    out.float().square().sum().backward()
    return [out.detach().float(), query.grad.float(), key.grad.float(), value.grad.float()]


@pytest.mark.gpu
@pytest.mark.parametrize("packed", [False, True])
def test_compiled_flex_forward_and_backward_on_cuda(packed):
    """bf16 flex against the float32 dense reference: its error (output and each gradient, as a norm) at most
    twice the bf16 dense path's own, plus 1e-3 of the reference's norm."""
    columns = 384
    anchors, groups = _rollout(columns=columns, sizes=(columns, 269, 188, 132, 77), device="cuda")
    documents = torch.repeat_interleave(torch.tensor(DOCUMENTS, device="cuda"), 14, dim=1)[:, :columns] \
        if packed else None
    query, key, value = _qkv(anchors.shape[1], heads=8, kv_heads=2, dim=64, device="cuda",
                             dtype=torch.bfloat16)
    dense_mask = rollout_mask(anchors, groups, documents, "dense")
    reference = _output_and_grads(query.float(), key.float(), value.float(), dense_mask)
    dense = _output_and_grads(query, key, value, dense_mask)
    flex = _output_and_grads(query, key, value, rollout_mask(anchors, groups, documents, "flex"))
    for index, (want, bf16_dense, got) in enumerate(zip(reference, dense, flex)):
        dense_error, flex_error = (bf16_dense - want).norm(), (got - want).norm()
        assert flex_error <= 2 * dense_error + 1e-3 * want.norm(), (index, flex_error.item(), dense_error.item())
