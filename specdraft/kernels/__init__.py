"""Fused and chunked ops, each beside a plain PyTorch reference that is its spec.

Each op lives in `kernels/<op>/`: `reference.py` (the spec, short, shape comments), the fast version, and an
`__init__.py` exposing one function that dispatches. `SPECDRAFT_KERNELS=reference` forces the references;
`SPECDRAFT_KERNELS=reference:OP,...` those ops' alone.
Triton kernels run on CUDA tensors, and on CPU tensors under `TRITON_INTERPRET=1` (how CI tests them).

Ops: `soft_ce` (training loss); for the runtime, `draft_topk` (log-softmax + top-k + d2t over the draft
vocabulary), `tree_frontier.advance_frontier` (a tree expansion step's joint scores, next frontier and gathers),
`tree_select.select_tree` (the tree kept after the expansion: its best candidates, parents, depths and mask),
`tree_verify.verify_greedy` (target argmax per tree node + the accepted path), `tree_sample.verify_sampled` (its
T > 0 counterpart: rejection sampling over the tree, the accepted path and the bonus), `sampled_topk` (T > 0
sampled children: a Gumbel-max child and the k - 1 best others), `path_commit.commit_path` (the
commit's bookkeeping: the path's cache slots, next tokens, host record, features, new root),
`kv_compact.compact_kv` (accepted nodes' KV entries moved to consecutive slots) and `tree_attention` (verify-pass
attention over the prefix and the tree, flash-decoding style; a drafting step's over its scratch slots too),
`draft_input` (the EAGLE-3 draft layer's [norm(embedding) ; norm(hidden)] input: the gather, both norms and the
join), `top_entropy` (a draft distribution's entropy over its top M tokens), `prune_children` (a tree scorer's
pruning of a depth's children: C2T's FFN over their joint probability, their parent's top-M entropy and their
depth, in one launch); in every decoder layer (the target's and the draft heads'), `rms_norm` ((residual add +)
RMSNorm), `rope_cache` (rotary q and k + the KV-cache write) and `silu_mul` (SwiGLU's activation), one launch each,
rounding where the unfused ops round (`rounding.py`); in a mixture-of-experts layer (Qwen3-MoE, Mixtral),
`grouped_experts` (each row through its k routed experts, a touched expert's weights read once a block of its
rows, untouched ones never); for bulk generation (decoding/batched.py), `ragged_attention`
(each query over its own sequence's slots of a cache that holds many). The runtime ops are CUDA-graph capturable:
static shapes, no host sync, per-call scalars as device tensors.
`python -m tools.bench.kernels` times each against its reference on a GPU.
For training, `adamw8bit` is one tensor's AdamW step from blockwise 8-bit moments (and `AdamW8bitFused`, the
optimizer of train.optimizer=adamw8bit_fused).
"""
import importlib.util
import os

import torch


def use_reference(op: str = "") -> bool:
    """True when SPECDRAFT_KERNELS asks for references: `reference` for every op, `reference:OP,OP` for those ops
    alone (the kernels' directory names: one kernel's share of a run, measured against the same run without it)."""
    value = os.environ.get("SPECDRAFT_KERNELS", "auto")
    if value.startswith("reference:"):
        return op in value[len("reference:"):].split(",")
    return value == "reference"


def triton_interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def use_triton(tensor: torch.Tensor, op: str = "") -> bool:
    """Whether op `op` on `tensor` runs its Triton kernel: Triton is installed, its reference is not forced, and
    the tensor is on a CUDA device (or Triton interprets kernels on the CPU)."""
    if use_reference(op) or importlib.util.find_spec("triton") is None:
        return False
    return tensor.is_cuda or triton_interpreting()
