"""DFlash draft (Chen et al., "DFlash: Block Diffusion for Flash Speculative Decoding", arXiv:2602.06036; z-lab).

A small stack of decoder layers drafts a whole block in one forward: its input is the block's token embeddings
(the anchor, a real token, then block_size - 1 copies of a mask token), its attention sees the target's fused
context features of every position before the anchor and, bidirectionally, the whole block; position k of the block
gives the distribution of the token k places after the anchor. The target's embedding table and (by default) its LM
head are shared and frozen. At inference the anchor is the root, so one draft pass proposes the block_size - 1
tokens after it (the runtime's block drafter contract, core/drafting.py; decoding/cycles/block.py verifies them).

Training samples `num_anchors` anchors among each sequence's answer tokens, one block each, all blocks of a batch
in one forward under the block attention mask (blocks.py: flex attention on CUDA, dense elsewhere), and weighs
block position k's soft cross-entropy against the target by exp(-(k - 1) / gamma) (loss.py).

The package: `config` (DFlashConfig), `blocks` (anchors, the block mask), `model` (DFlashDraft), `loss`, `export`
(SGLang's and z-lab's layout as `hf`, vLLM's `speculators`) and `drafter` (the runtime's block drafter).
"""
from specdraft.methods.base import ExportFormat, MethodSpec
from specdraft.methods.dflash.blocks import Anchors, anchor_candidates, block_mask, dense_block_mask, \
    flex_block_mask, sample_anchors
from specdraft.methods.dflash.config import DFlashConfig, default_feature_layers, dflash_feature_layers
from specdraft.methods.dflash.drafter import DFlashDrafter, dflash_runtime
from specdraft.methods.dflash.export import dflash_export_config, dflash_export_tensors, dflash_keys, dflash_to_hf, \
    dflash_to_speculators
from specdraft.methods.dflash.flops import dflash_train_flops
from specdraft.methods.dflash.loss import block_inputs, dflash_loss
from specdraft.methods.dflash.model import DFlashDecoderLayer, DFlashDraft

SPEC = MethodSpec(
    name="dflash",
    config=DFlashConfig,
    build=DFlashDraft,
    loss=dflash_loss,
    feature_layers=dflash_feature_layers,
    exports={"hf": ExportFormat(write=dflash_to_hf, required_keys=dflash_keys),
             "speculators": ExportFormat(write=dflash_to_speculators, required_keys=dflash_keys)},
    runtime=dflash_runtime,
    export_config=dflash_export_config,
    export_tensors=dflash_export_tensors,
    train_flops=dflash_train_flops,
)

__all__ = ["SPEC", "Anchors", "DFlashConfig", "DFlashDecoderLayer", "DFlashDraft", "DFlashDrafter",
           "anchor_candidates", "block_inputs", "block_mask", "default_feature_layers", "dense_block_mask",
           "dflash_export_config", "dflash_export_tensors", "dflash_feature_layers", "dflash_keys", "dflash_loss",
           "dflash_runtime", "dflash_to_hf", "dflash_to_speculators", "dflash_train_flops", "flex_block_mask",
           "sample_anchors"]
