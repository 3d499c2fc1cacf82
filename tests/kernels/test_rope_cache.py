"""rope_cache: the Triton kernel (under TRITON_INTERPRET=1 on CPU) gives the reference's bits in float32, bfloat16
and float16 (rotated q, and the cache after the write, every other slot untouched); the reference rotates as
Hugging Face Llama's apply_rotary_pos_emb."""
import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from specdraft.core.errors import SpecdraftError
from specdraft.kernels.rope_cache import rope_cache, rope_cache_reference
from specdraft.kernels.rope_cache.triton_kernel import rope_cache_triton
from specdraft.layers.blocks import rope_cos_sin


def _inputs(tokens, q_heads, kv_heads, head_dim, dtype, seq_len=40, copies=None, seed=0):
    generator = torch.Generator().manual_seed(seed)
    qkv = torch.randn(tokens, (q_heads + 2 * kv_heads) * head_dim, generator=generator).mul(2).to(dtype)
    q, k, v = qkv.split([q_heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)  # strided views
    q, k, v = (t.view(tokens, -1, head_dim) for t in (q, k, v))
    cos, sin = rope_cos_sin(torch.arange(seq_len), head_dim, 10000.0, dtype)  # [S, D]
    positions = torch.randperm(seq_len, generator=generator)[:tokens]
    slots = torch.randperm(seq_len, generator=generator)[:tokens]
    cache_shape = (kv_heads, seq_len, head_dim) if copies is None else (copies, kv_heads, seq_len, head_dim)
    caches = [torch.randn(cache_shape, generator=generator).to(dtype) for _ in range(2)]
    return (q, k, v, cos, sin, positions), caches, slots


def _run(fn, args, caches, slots):
    k_cache, v_cache = (c.clone() for c in caches)
    q_rot = fn(*args, k_cache, v_cache, slots)
    return q_rot, k_cache, v_cache


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tokens, q_heads, kv_heads, head_dim, copies", [
    (1, 9, 3, 64, None), (5, 4, 2, 16, None), (3, 6, 6, 24, None), (4, 4, 1, 32, 3)])
def test_triton_matches_reference_bits(dtype, tokens, q_heads, kv_heads, head_dim, copies):
    args, caches, slots = _inputs(tokens, q_heads, kv_heads, head_dim, dtype, copies=copies)
    expected = _run(rope_cache_reference, args, caches, slots)
    got = _run(rope_cache_triton, args, caches, slots)
    assert got[0].shape == (q_heads, tokens, head_dim) and got[0].is_contiguous()
    for e, g in zip(expected, got):
        assert torch.equal(e, g)


def test_strided_positions_and_slots():
    """Positions expanded from one value (stride 0) and slots read with a stride, as the tree builder passes them."""
    (q, k, v, cos, sin, _), caches, _ = _inputs(3, 4, 2, 16, torch.bfloat16)
    positions, slots = torch.tensor([7]).expand(3), torch.tensor([9, 0, 4, 0, 2, 0])[::2]
    expected = _run(rope_cache_reference, (q, k, v, cos, sin, positions), caches, slots)
    for e, g in zip(expected, _run(rope_cache_triton, (q, k, v, cos, sin, positions), caches, slots)):
        assert torch.equal(e, g)


@pytest.mark.parametrize("implementation", [rope_cache_reference, rope_cache_triton])
def test_position_offset_and_slot_base(implementation):
    """A drafting step's form: rotated at positions - 1, written at prefix_len + scratch slot (a device scalar),
    the same as the unshifted call with both applied beforehand."""
    (q, k, v, cos, sin, positions), caches, slots = _inputs(4, 4, 2, 16, torch.bfloat16)
    positions, slots, base = positions.clamp(min=1), slots.clamp(max=30), torch.tensor([7])
    expected = _run(rope_cache_reference, (q, k, v, cos, sin, positions - 1), caches, slots + base)
    caches_got = [c.clone() for c in caches]
    q_rot = implementation(q, k, v, cos, sin, positions, *caches_got, slots, position_offset=-1, slot_base=base)
    for e, g in zip(expected, (q_rot, *caches_got)):
        assert torch.equal(e, g)


def test_rows_without_positions_and_dispatch(monkeypatch):
    (q, k, v, cos, sin, positions), caches, slots = _inputs(3, 4, 2, 16, torch.bfloat16)
    args = (q, k, v, cos[positions], sin[positions], None)
    expected = _run(rope_cache_reference, (q, k, v, cos, sin, positions), caches, slots)
    for implementation in ("auto", "reference"):
        monkeypatch.setenv("SPECDRAFT_KERNELS", implementation)
        for e, g in zip(expected, _run(rope_cache, args, caches, slots)):
            assert torch.equal(e, g)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_rotates_as_hf_llama(dtype):
    (q, k, v, cos, sin, positions), caches, slots = _inputs(3, 4, 2, 16, dtype)
    q_rot, k_cache, v_cache = _run(rope_cache_reference, (q, k, v, cos, sin, positions), caches, slots)
    hf_q, hf_k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos[positions][None],
                                      sin[positions][None])
    assert torch.equal(q_rot, hf_q[0])
    assert torch.equal(k_cache[:, slots], hf_k[0]) and torch.equal(v_cache[:, slots], v.transpose(0, 1))


def test_bad_inputs_are_named():
    (q, k, v, cos, sin, positions), (k_cache, v_cache), slots = _inputs(2, 4, 2, 16, torch.bfloat16)
    with pytest.raises(SpecdraftError, match="dtype"):
        rope_cache_triton(q, k, v, cos.float(), sin.float(), positions, k_cache, v_cache, slots)
    with pytest.raises(SpecdraftError, match="shapes"):
        rope_cache_triton(q, k, v, cos, sin, positions, k_cache[:1], v_cache[:1], slots)
