"""PosS: position specialists on the EAGLE-3 head (Huang et al., "Position Specialist Generates Better Draft
for Speculative Decoding", arXiv:2506.03566).

EAGLE-3's head drafts every position with one decoder layer, although the features it reads drift further from
the target's with every drafted token. PosS-n keeps EAGLE-3's shared parts (the `fc` fusion of low/mid/high
target features, the draft vocabulary d2t/t2d, the final norm and LM head) and gives each band of n draft
positions its own decoder layer: specialist j drafts positions [j·n, (j+1)·n) of a drafting round, and
positions past the last band go to the last specialist. In training-time test (see eagle3/), TTT step i
(which drafts position i, i.e. the token at depth i + 1) goes through specialist min(⌊i/n⌋, S - 1).

Keys each specialist attends to (our choice; the paper leaves it to the implementation):
  - the confirmed prefix: every specialist has its own step-0 keys, projected by its own norms and k/v
    projections from the same inputs as EAGLE-3's step 0 (fused target features at column t, embedding of
    token t+1). Specialist 0 writes them while it runs step 0; the others only project keys and values
    (`specialist_prefix_kv`, no attention or MLP), each once per sequence;
  - the drafted tokens above the prefix (TTT steps 1..i-1 at the same column): one shared chain of keys,
    each written by the specialist that drafted that depth. A specialist therefore reads its predecessors'
    keys; training-time test trains exactly this.
At inference a drafter thus keeps S prefix caches (one per specialist, filled in one pass when confirmed
tokens arrive) and one scratch region for drafted tokens, so every depth is still one batched call through
one specialist. Initialised from an EAGLE-3 checkpoint (`init_from`), every specialist is a copy of EAGLE-3's
layer and PosS computes exactly what that EAGLE-3 head computes (tests/test_poss.py checks it). Packed rows,
flex attention and activation checkpointing work as for EAGLE-3 (eagle3.ttt_unroll).

Export (`--format hf`): EAGLE-3's config keys plus `poss_config`, which says which specialist serves which draft
depth, and weights `fc`, `norm`, `lm_head`, `d2t`, `t2d`, `specialists.{j}.*` (each laid out as EAGLE-3's
`midlayer.*`). SGLang and vLLM do not load it (its architecture `PossEagle3Draft` is ours); specdraft's
evaluator and runtime do.

`config` (PossConfig), `model` (PossDraft, the specialists' prefix keys), `loss` (the unroll through the
specialists), `export` (the layout and the warm start) and `drafter` (the runtime's).
"""
from specdraft.methods.base import ExportFormat, MethodSpec
from specdraft.methods.eagle3 import eagle3_feature_layers, eagle3_warm_start
from specdraft.methods.poss.config import PossConfig
from specdraft.methods.poss.drafter import PossDrafter, poss_runtime
from specdraft.methods.poss.export import poss_hf_keys, poss_initialize, poss_to_hf, specialist_by_depth
from specdraft.methods.poss.loss import poss_loss, poss_unroll
from specdraft.methods.poss.model import PossDraft, PrefixKeys, specialist_prefix_kv

SPEC = MethodSpec(
    name="poss",
    config=PossConfig,
    build=PossDraft,
    loss=poss_loss,
    feature_layers=eagle3_feature_layers,
    exports={"hf": ExportFormat(write=poss_to_hf, required_keys=poss_hf_keys)},
    export_requires=("num_specialists",),
    warm_start=eagle3_warm_start,
    initialize=poss_initialize,
    runtime=poss_runtime,
)

__all__ = ["SPEC", "PossConfig", "PossDraft", "PossDrafter", "PrefixKeys", "poss_hf_keys", "poss_initialize",
           "poss_loss", "poss_runtime", "poss_to_hf", "poss_unroll", "specialist_by_depth", "specialist_prefix_kv"]
