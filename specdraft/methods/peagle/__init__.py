"""P-EAGLE: EAGLE-3's head drafting K tokens in one forward (parallel drafting, AWS, arXiv:2602.01469; vLLM serves it
as eagle3 with `parallel_drafting`).

EAGLE-3 drafts depth d + 1 from its own output at depth d: K tokens are K sequential forwards of the draft. P-EAGLE
drafts depth 1 as EAGLE-3 does (the fused target features at the prefix's last column and the root token) and
depths 2..K from mask rows: each reads the mask token's embedding and a learned `mask_hidden` in place of the
target's features (through fc as they go), stands at the next rotary position, and attends to the prefix and to the
mask rows before it. No mask row reads a drafted token, so all K depths come out of one forward (`drafter`).

Training runs every column's K depths in one call of the decoder layer over a batch's rollout rows (`rollout`,
attention in specdraft.kernels.rollout_attention), with conditional drop-token sampling: depth d keeps about
T * max(r ** (d - 1), floor) of the T columns, drawn among those depth d - 1 kept, answer positions first, so a
batch runs about T * (1 + sum of those ratios) rows rather than T * K. The loss is EAGLE-3's soft cross-entropy
per depth over the draft vocabulary (`loss`). Depth 1's rows are EAGLE-3's TTT step 0 exactly.

`config` (PEagleConfig), `model` (PEagleDraft, the rollout layer), `rollout` (the rows and their sampling), `loss`,
`export` (SGLang's and vLLM's layouts with mask_hidden and the mask token) and `drafter` (the runtime's).
"""
from specdraft.methods.base import ExportFormat, MethodSpec
from specdraft.methods.eagle3 import eagle3_feature_layers
from specdraft.methods.peagle.config import PEagleConfig, cod_sizes, resolve_mask_token
from specdraft.methods.peagle.drafter import PEagleDrafter, peagle_runtime
from specdraft.methods.peagle.export import (
    peagle_export_tensors,
    peagle_hf_keys,
    peagle_speculators_keys,
    peagle_to_hf,
    peagle_to_speculators,
)
from specdraft.methods.peagle.flops import peagle_train_flops
from specdraft.methods.peagle.loss import peagle_loss, rollout_forward, rollout_hidden
from specdraft.methods.peagle.model import MaskInput, PEagleDraft, RolloutRunner, rollout_layer
from specdraft.methods.peagle.rollout import Rollout, rollout_inputs, sample_rollout

SPEC = MethodSpec(
    name="peagle",
    config=PEagleConfig,
    build=PEagleDraft,
    loss=peagle_loss,
    feature_layers=eagle3_feature_layers,
    exports={"hf": ExportFormat(write=peagle_to_hf, required_keys=peagle_hf_keys),
             "speculators": ExportFormat(write=peagle_to_speculators, required_keys=peagle_speculators_keys)},
    runtime=peagle_runtime,
    export_requires=("num_depths",),
    export_tensors=peagle_export_tensors,
    graph_safe_loss=True,
    train_flops=peagle_train_flops,
)

__all__ = ["SPEC", "MaskInput", "PEagleConfig", "PEagleDraft", "PEagleDrafter", "Rollout", "RolloutRunner",
           "cod_sizes", "peagle_export_tensors", "peagle_hf_keys", "peagle_loss", "peagle_runtime",
           "peagle_speculators_keys", "peagle_to_hf", "peagle_to_speculators", "peagle_train_flops",
           "resolve_mask_token", "rollout_forward", "rollout_hidden", "rollout_inputs", "rollout_layer", "sample_rollout"]
