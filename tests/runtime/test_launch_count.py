"""Kernel launches of one target decoder layer in a decode step (one token, bfloat16) and in a verify pass (a
tree of nodes): 10 with the fused kernels (the layer's closing residual add rides in the next layer's first norm,
and tree attention writes its output token-major, so the o projection reads it without a copy), where the unfused layer (float32 RMSNorm as 8 ops twice, rope as 5 ops for q and for k, index_copy cache writes,
silu and mul apart) launched 38 with the same two tree-attention kernels. Counted on the CPU: every ATen op that
computes (views, metadata and allocations launch no kernel) plus every Triton kernel (under the interpreter,
whose own host copies are not counted), so a change that unfuses an op fails here."""
import pytest
import torch

from specdraft.core.types import TargetInfo
from specdraft.decoding.launches import LaunchCounter
from specdraft.decoding.verifier import from_hf
from specdraft.testing.tiny import tiny_llama_config

FUSED_BOUND = 10  # add + norm, qkv, rope + cache, attention (2 kernels), o, add + norm, gate/up, silu * up, down
UNFUSED_AT_LEAST = 35  # the references: the unfused layer's ops, with the attention's reference


def _decode_layer_launches(monkeypatch, kernels: str, num_tokens: int = 1):
    from transformers import LlamaForCausalLM

    monkeypatch.setenv("SPECDRAFT_KERNELS", kernels)
    hf = LlamaForCausalLM(tiny_llama_config(layers=1)).eval().to(torch.bfloat16)  # casts count, as on a GPU
    model = from_hf(hf, TargetInfo.from_hf_config(hf.config, "tiny"))
    info, max_len = model.info, 16
    cos, sin = torch.randn(2, max_len, info.head_dim)
    model.allocate(max_len, cos, sin)
    hidden, pending = torch.randn(2, num_tokens, info.hidden_size, dtype=torch.bfloat16)  # a layer inside the stack
    prefix_len = torch.tensor([5])
    positions = slots = prefix_len + torch.arange(num_tokens)  # [N] a chain after 5 confirmed tokens
    tree_mask = torch.ones(num_tokens, num_tokens, dtype=torch.bool).tril()
    with torch.no_grad(), LaunchCounter() as counter:
        model.layers[0](hidden, pending, (model.rope_cos, model.rope_sin), positions, model.k_cache[0],
                        model.v_cache[0], slots, prefix_len, tree_mask, False)
    return counter.launches


@pytest.mark.triton_kernels
@pytest.mark.parametrize("num_tokens", [1, 4], ids=["decode", "verify"])
def test_a_decode_layer_launches_few_kernels(monkeypatch, num_tokens):
    fused = _decode_layer_launches(monkeypatch, "auto", num_tokens)
    assert len(fused) <= FUSED_BOUND, fused
    assert {"triton:_rms_norm_kernel", "triton:_rope_cache_kernel", "triton:_silu_mul_kernel"} <= set(fused)
    unfused = _decode_layer_launches(monkeypatch, "reference", num_tokens)  # the references run the old layer's ops
    assert len(unfused) >= UNFUSED_AT_LEAST, unfused
