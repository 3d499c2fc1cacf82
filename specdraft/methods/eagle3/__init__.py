"""EAGLE-3 draft head (Li et al., "EAGLE-3: Scaling up Inference Acceleration of LLMs via Training-Time Test",
arXiv:2503.01840), with a frequency-ranked draft vocabulary (FR-Spec, arXiv:2502.14856).

The head fuses three target hidden states (low, mid, high) with `fc`, runs one decoder layer whose attention
input is [embedding of the next token ; hidden state] (2H wide), and predicts the token after next over a draft
vocabulary of the most frequent answer tokens. Feature layers are the inputs of target layers 2, L/2 and L-3
(SmolLM2, L=30: 2, 15, 27). It trains with training-time test (`ttt`): the loss at TTT step j is the soft
cross-entropy against the target's distribution over the draft vocabulary at position t+1+j, weighted by
`step_loss_decay ** j` (`loss`). The TTT attention runs on flex attention with a block mask on CUDA and densely
elsewhere (specdraft/kernels/ttt_attention); the loss is the fused soft cross-entropy (specdraft/kernels/soft_ce).

The package is the public base other heads build on (PosS): `config` (Eagle3Config), `model` (Eagle3Draft and
its layers), `ttt` (the unroll), `loss`, `export` (SGLang and vLLM layouts, warm starts) and `drafter` (the
runtime's drafter).
"""
from specdraft.methods.base import ExportFormat, MethodSpec
from specdraft.methods.eagle3.config import EAGLE31_FLAGS, Eagle3Config, eagle3_feature_layers, refuse_eagle31
from specdraft.methods.eagle3.drafter import Eagle3Drafter, eagle3_runtime
from specdraft.methods.eagle3.export import (
    check_source,
    eagle3_export_config,
    eagle3_export_tensors,
    eagle3_hf_config,
    eagle3_hf_keys,
    eagle3_initialize,
    eagle3_speculators_keys,
    eagle3_to_hf,
    eagle3_to_speculators,
    eagle3_warm_start,
    load_initial_state,
)
from specdraft.methods.eagle3.flops import eagle3_train_flops
from specdraft.methods.eagle3.loss import eagle3_loss
from specdraft.methods.eagle3.model import KV, Eagle3DecoderLayer, Eagle3Draft, fused_features
from specdraft.methods.eagle3.ttt import TTTInputs, ttt_inputs, ttt_unroll

SPEC = MethodSpec(
    name="eagle3",
    config=Eagle3Config,
    build=Eagle3Draft,
    loss=eagle3_loss,
    feature_layers=eagle3_feature_layers,
    exports={"hf": ExportFormat(write=eagle3_to_hf, required_keys=eagle3_hf_keys),
             "speculators": ExportFormat(write=eagle3_to_speculators, required_keys=eagle3_speculators_keys)},
    runtime=eagle3_runtime,
    export_config=eagle3_export_config,
    export_tensors=eagle3_export_tensors,
    warm_start=eagle3_warm_start,
    initialize=eagle3_initialize,
    graph_safe_loss=True,
    train_flops=eagle3_train_flops,
)

__all__ = ["EAGLE31_FLAGS", "KV", "SPEC", "Eagle3Config", "Eagle3DecoderLayer", "Eagle3Draft", "Eagle3Drafter",
           "TTTInputs", "check_source", "eagle3_export_config", "eagle3_export_tensors", "eagle3_feature_layers",
           "eagle3_hf_config", "eagle3_hf_keys", "eagle3_initialize", "eagle3_loss", "eagle3_runtime",
           "eagle3_speculators_keys", "eagle3_to_hf", "eagle3_to_speculators", "eagle3_train_flops", "eagle3_warm_start",
           "fused_features", "load_initial_state", "refuse_eagle31", "ttt_inputs", "ttt_unroll"]
