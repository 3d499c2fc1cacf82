"""EAGLE-3's training FLOPs a sequence token (MethodSpec.train_flops): the training suite's efficiency figures."""
from __future__ import annotations

from typing import Dict

from specdraft.core.types import TargetInfo
from specdraft.methods.eagle3.config import Eagle3Config, eagle3_feature_layers
from specdraft.methods.shared import BACKWARD, attention_flops, causal_keys, layer_matmul_flops


def eagle3_train_flops(cfg: Eagle3Config, target: TargetInfo, seq_len: int) -> Dict[str, float]:
    """fc over the fused features once, then each of the ttt_steps steps: the decoder layer on its 2H-wide input,
    the attention over the causal (or windowed) prefix and the diagonal keys of the steps before, and the LM head
    over the draft vocabulary, all forward and backward; the teacher's draft-vocabulary rows and the full-vocabulary
    argmax scan (whether the target's token is in the draft vocabulary) once, forward only."""
    hidden, draft_vocab = target.hidden_size, min(cfg.draft_vocab_size, target.vocab_size)
    layer = layer_matmul_flops(target, 2 * hidden, cfg.intermediate_size or target.intermediate_size)
    window = cfg.ttt_window()
    prefix = causal_keys(seq_len, window.size, window.sinks)
    attention = sum(attention_flops(target, prefix + step) for step in range(cfg.ttt_steps))
    features = len(eagle3_feature_layers(cfg, target))
    return {"fc": BACKWARD * 2 * features * hidden * hidden, "layer": BACKWARD * cfg.ttt_steps * layer,
            "attention": BACKWARD * attention, "lm_head": BACKWARD * cfg.ttt_steps * 2 * hidden * draft_vocab,
            "teacher_head": 2 * hidden * draft_vocab, "argmax_scan": 2 * hidden * target.vocab_size}
