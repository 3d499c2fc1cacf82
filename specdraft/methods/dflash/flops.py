"""DFlash's training FLOPs a sequence token (MethodSpec.train_flops): the training suite's efficiency figures."""
from __future__ import annotations

from typing import Dict

from specdraft.core.types import TargetInfo
from specdraft.methods.dflash.config import DFlashConfig, dflash_feature_layers, draft_vocab_size
from specdraft.methods.shared import BACKWARD, attention_flops, layer_matmul_flops


def dflash_train_flops(cfg: DFlashConfig, target: TargetInfo, seq_len: int) -> Dict[str, float]:
    """Forward and backward: the fc over the context's fused features and each layer's context keys and values over
    it (every token), the layers over the num_anchors x block_size block positions (attention: the context before
    the anchor, half the sequence on average, and the block) and the head over them; the teacher's rows of the
    same vocabulary once a block position, forward only. Per sequence token."""
    hidden, kv_width = target.hidden_size, target.num_kv_heads * target.head_dim
    blocks = cfg.num_anchors * cfg.block_size
    head = draft_vocab_size(cfg, target) or target.vocab_size
    features = len(dflash_feature_layers(cfg, target))
    context = 2 * features * hidden * hidden + cfg.num_layers * 2 * hidden * 2 * kv_width
    layer = layer_matmul_flops(target, hidden, cfg.intermediate_size or target.intermediate_size) \
        + attention_flops(target, seq_len / 2 + cfg.block_size)
    share = blocks / seq_len  # block positions a sequence token
    return {"context": BACKWARD * context, "layers": BACKWARD * cfg.num_layers * share * layer,
            "lm_head": BACKWARD * share * 2 * hidden * head, "teacher_head": share * 2 * hidden * head}
