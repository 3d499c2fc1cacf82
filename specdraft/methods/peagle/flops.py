"""P-EAGLE's training FLOPs a sequence token (MethodSpec.train_flops): the training suite's efficiency figures."""
from __future__ import annotations

from typing import Dict

from specdraft.core.types import TargetInfo
from specdraft.methods.eagle3 import eagle3_feature_layers
from specdraft.methods.peagle.config import PEagleConfig, cod_sizes
from specdraft.methods.shared import BACKWARD, attention_flops, causal_keys, layer_matmul_flops


def peagle_train_flops(cfg: PEagleConfig, target: TargetInfo, seq_len: int) -> Dict[str, float]:
    """Forward and backward over the rollout rows that conditional drop-token sampling keeps (cod_sizes: T rows of
    depth 1 and fewer of each depth after): fc over the fused features once a column, the decoder layer on each row's
    2H-wide input, its attention over the causal prefix and the mask rows before it, the LM head over the draft
    vocabulary; the teacher's draft-vocabulary rows and the full-vocabulary argmax scan once, forward only."""
    hidden, draft_vocab = target.hidden_size, min(cfg.draft_vocab_size, target.vocab_size)
    sizes = cod_sizes(seq_len, cfg)
    rows = sum(sizes) / seq_len  # rollout rows a sequence token
    keys = sum(size * (causal_keys(seq_len) + depth) for depth, size in enumerate(sizes)) / sum(sizes)
    layer = layer_matmul_flops(target, 2 * hidden, cfg.intermediate_size or target.intermediate_size)
    features = len(eagle3_feature_layers(cfg, target))
    return {"fc": BACKWARD * 2 * features * hidden * hidden, "layer": BACKWARD * rows * layer,
            "attention": BACKWARD * rows * attention_flops(target, keys),
            "lm_head": BACKWARD * rows * 2 * hidden * draft_vocab,
            "teacher_head": 2 * hidden * draft_vocab, "argmax_scan": 2 * hidden * target.vocab_size}
