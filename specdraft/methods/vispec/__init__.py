"""ViSpec: vision-aware speculative decoding (Kang et al., "ViSpec: Accelerating Vision-Language Models with
Vision-Aware Speculative Decoding", NeurIPS 2025, arXiv:2509.15235) on specdraft's EAGLE-3 head.

A text-only draft cannot see the image its vision-language target talks about. ViSpec's draft adds an image adaptor
(learned queries cross-attending over each image's token embeddings: the first num_queries - 1 outputs stand in
for the image's span in the draft's sequence, the last is a global image feature) and `img_fc`, which joins that
global feature with every later hidden state the draft reads. It trains with EAGLE-3's training-time test on its
own fed-back states, over answers its target regenerated at length (`distill.answer_instruction`).

`config` (VispecConfig), `model` (VispecDraft, the adaptor, where images go in the draft's sequence), `loss` (the
compressed batch and its unroll), `drafter` (the runtime's, reading the prompt's image context) and `export`.
"""
from specdraft.methods.base import ExportFormat, MethodSpec
from specdraft.methods.eagle3 import eagle3_feature_layers, eagle3_warm_start
from specdraft.methods.vispec.config import VispecConfig
from specdraft.methods.vispec.drafter import VispecDrafter, vispec_runtime
from specdraft.methods.vispec.export import vispec_hf_keys, vispec_initialize, vispec_to_hf
from specdraft.methods.vispec.loss import DraftColumns, draft_columns, vispec_loss, vispec_unroll
from specdraft.methods.vispec.model import ImageAdaptor, VispecDraft, image_inputs

SPEC = MethodSpec(
    name="vispec",
    config=VispecConfig,
    build=VispecDraft,
    loss=vispec_loss,
    feature_layers=eagle3_feature_layers,
    exports={"hf": ExportFormat(write=vispec_to_hf, required_keys=vispec_hf_keys)},
    runtime=vispec_runtime,
    warm_start=eagle3_warm_start,
    initialize=vispec_initialize,
)

__all__ = ["SPEC", "DraftColumns", "ImageAdaptor", "VispecConfig", "VispecDraft", "VispecDrafter", "draft_columns",
           "image_inputs", "vispec_hf_keys", "vispec_initialize", "vispec_loss",
           "vispec_runtime", "vispec_to_hf", "vispec_unroll"]
