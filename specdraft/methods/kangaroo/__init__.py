"""Kangaroo: self-speculative decoding with double early exiting (Liu et al., "Kangaroo: Lossless
Self-Speculative Decoding via Double Early Exiting", arXiv:2404.18911).

The draft is the target itself, cut after its first ℓ decoder layers, plus a small trained adapter: one
attention block (the target's head geometry) between a norm and a residual, no MLP. It reads the target's
hidden state at index ℓ (specdraft's convention: the input of decoder layer ℓ, i.e. after layers 0..ℓ-1) and
drafts through the target's own final norm and LM head, frozen and shared. Drafting stops early when the
adapter's top-1 probability falls below η (`exit_threshold`; the second early exit, the runtime's chain cycles).

Exit layer ℓ (`exit_layer`): the paper exits Vicuna-7B after 2 of its 32 layers; its ablation over depth shows
that deeper exits buy acceptance at the price of a costlier draft step, with the best speed-up that shallow.
The default keeps that share of the depth, ℓ = max(1, round(L / 16)) (SmolLM2-135M, L=30: 2; Llama-3.1-8B: 2).
On SmolLM2 the sweep agrees: ℓ = 1, 2, 3, 4 gave 1.43, 1.46, 1.33 and 1.27x plain decoding on a (3, 4, 12) tree
(docs/benchmarks.md); sweep it on other targets (`python -m tools.bench.runtime kangaroo EXPORT...`).

Shared target parts: the LM head and final norm are the target's, never copies: in training they come from the
frozen target the trainer holds (`bind_target`), in the evaluator from the target it loads (`bind_target`), in
the runtime from its compact target (`lm_head_weight`, `final_norm`). Exports hold only the adapter and the
draft vocabulary, and every consumer loads the target anyway to verify. The draft vocabulary (FR-Spec, as for
EAGLE-3) picks rows of the shared LM head: `draft_vocab_size: null` keeps the whole vocabulary (the paper);
a smaller one makes each draft step cheaper (the LM head is most of a small target's per-token cost).

Training: soft cross-entropy between the adapter's distribution at column t (it has read x_0..x_t through the
shallow layers) and the target's final distribution at t, i.e. over the next token x[t+1]. Training-time test
(`ttt_steps`) needs no unroll here: the adapter reads the target's shallow states of the tokens, never its own
outputs, so with teacher-forced tokens (as EAGLE-3's TTT) step j at column t computes exactly what step 0
computes at column t + j, and along every chain the target accepts, the drafted tokens are those real tokens.
Teacher forcing is thus exact for Kangaroo; unrolling on self-drafted tokens would need the shallow layers run
again per step on tokens that, once wrong, the verifier rejects together with all that follows, so it would
train nothing a greedy chain uses. `ttt_steps` sets how far acc@k and tau_sim simulate the chain (from the
step-0 predictions shifted by j); the loss is step 0's, the paper's objective (more steps would only rescale it).

Inference: confirmed positions' adapter keys come from the target's own feature ℓ (computed by verification);
each drafted token goes through the target's layers 0..ℓ-1 (with their KV cache) and then the adapter. In the
runtime (`KangarooDrafter`) a chain's verify starts at layer ℓ over those shallow states (a tree's too, when the
engine asks: its drafter then runs every tree candidate through the shallow layers), and the engine's confidence
exit (specdraft/decoding/cycles/chain.py) defaults to `exit_threshold`.

Hierarchical drafting (`KangarooIntermediate`, runtime.intermediate = a Kangaroo export): the shallow layers and
the adapter, scored by the target's whole LM head, check another draft's tree before the target verifies the
sequence they keep (specdraft/decoding/hierarchy.py).

`config` (KangarooConfig, the exit layer), `model` (the adapter, KangarooDraft), `loss`, `export` and `drafter`
(the runtime's drafter and intermediate model).
"""
from specdraft.methods.base import ExportFormat, MethodSpec
from specdraft.methods.kangaroo.config import KangarooConfig, kangaroo_exit_layer, kangaroo_feature_layers
from specdraft.methods.kangaroo.drafter import (
    KangarooDrafter,
    KangarooIntermediate,
    kangaroo_intermediate,
    kangaroo_runtime,
)
from specdraft.methods.kangaroo.export import kangaroo_hf_keys, kangaroo_to_hf
from specdraft.methods.kangaroo.loss import chain_metrics, kangaroo_loss
from specdraft.methods.kangaroo.model import KV, AdapterAttention, KangarooDraft, kangaroo_bind

SPEC = MethodSpec(
    name="kangaroo",
    config=KangarooConfig,
    build=KangarooDraft,
    loss=kangaroo_loss,
    feature_layers=kangaroo_feature_layers,
    exports={"hf": ExportFormat(write=kangaroo_to_hf, required_keys=kangaroo_hf_keys)},
    export_requires=("exit_layer",),
    bind_target=kangaroo_bind,
    runtime=kangaroo_runtime,
    intermediate=kangaroo_intermediate,
    reads_embeddings=False,
)

__all__ = ["KV", "SPEC", "AdapterAttention", "KangarooConfig", "KangarooDraft", "KangarooDrafter",
           "KangarooIntermediate", "chain_metrics", "kangaroo_bind", "kangaroo_exit_layer", "kangaroo_feature_layers",
           "kangaroo_hf_keys", "kangaroo_intermediate", "kangaroo_loss", "kangaroo_runtime", "kangaroo_to_hf"]
