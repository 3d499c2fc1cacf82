"""compact_kv: the Triton kernel (under TRITON_INTERPRET=1 on CPU) against the reference, and the reference
against a plain loop over entries that reads every old row first."""
import pytest
import torch

from specdraft.core.errors import SpecdraftError
from specdraft.kernels.kv_compact import compact_kv, compact_kv_reference
from specdraft.kernels.kv_compact.triton_kernel import compact_kv_triton


def _expected(cache, src_slots, dst_start, count):
    old = cache.clone()
    moved = cache.clone()
    for entry in range(count):
        moved[:, :, dst_start + entry] = old[:, :, src_slots[entry]]
    return moved


def _check(src_slots, dst_start, count, shape=(2, 3, 24, 16), dtype=torch.float32, seed=0):
    generator = torch.Generator().manual_seed(seed)
    k_cache = torch.randn(shape, generator=generator).to(dtype)
    v_cache = torch.randn(shape, generator=generator).to(dtype)
    expected_k, expected_v = (_expected(c, src_slots, dst_start, count) for c in (k_cache, v_cache))
    args = (torch.tensor(src_slots, dtype=torch.int64), torch.tensor([dst_start]), torch.tensor([count]))
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    compact_kv_reference(ref_k, ref_v, *args)
    assert torch.equal(ref_k, expected_k) and torch.equal(ref_v, expected_v)
    compact_kv_triton(k_cache, v_cache, *args)
    assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)


@pytest.mark.parametrize("src_slots, dst_start, count", [
    ([5, 7, 9], 5, 3),  # slot 7 is read by entry 1 and written by entry 2
    ([5, 7, 9], 5, 2), ([5, 7, 9], 5, 0), ([4, 5, 6, 7], 4, 4),  # count < M, count = 0, nothing moves
    ([10, 12, 13, 17, 18, 20, 22, 23], 9, 8), ([10, 12, 13, 17, 18, 20, 22, 23], 9, 5),
    ([0], 0, 1), ([3, 20], 21, 2), ([10, 12], 8, 0)])
def test_triton_matches_reference(src_slots, dst_start, count):
    _check(src_slots, dst_start, count)


@pytest.mark.parametrize("shape, dtype", [((3, 2, 40, 24), torch.bfloat16), ((1, 4, 30, 64), torch.float16)])
def test_dtypes_and_head_dims(shape, dtype):
    _check([11, 13, 14, 19, 25], 11, 4, shape=shape, dtype=dtype)


def test_strided_caches_and_dispatch():
    """Caches that are views into a bigger buffer (as a batch-of-caches layout gives) move through strides."""
    buffer = torch.randn(2, 3, 2, 32, 16)
    k_cache, v_cache = buffer[:, :, 0], buffer[:, :, 1]  # [L, Hkv, S, D], not contiguous
    expected_k, expected_v = (_expected(c, [6, 8, 9], 6, 3) for c in (k_cache, v_cache))
    compact_kv(k_cache, v_cache, torch.tensor([6, 8, 9]), torch.tensor([6]), torch.tensor([3]))
    assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)
    with pytest.raises(SpecdraftError, match="same shape"):
        compact_kv_triton(k_cache, v_cache[:, :2], torch.tensor([6]), torch.tensor([6]), torch.tensor([1]))
