"""The draft-model baseline's loading (`runtime.draft_model`, `--draft-model`): a small model of the target's
tokenizer as the runtime's drafter (specdraft/decoding/draft_model.py), checked to share the target's tokenizer."""
from __future__ import annotations

import functools
from typing import Optional

import torch

from specdraft.config import TargetConfig
from specdraft.core.errors import SpecdraftError
from specdraft.decoding.draft_model import DraftModelDrafter, cost_in_target_layers
from specdraft.decoding.verifier import VerifierModel, from_hf, hf_rope_tables
from specdraft.targets import load_target
from specdraft.targets.load import LoadedTarget

PROBES = ("def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
          "The quick brown fox jumps over the lazy dog. 12345 + 67890 = 80235",
          "Übersetze: «Où est la gare?» 你好，世界！")
"""Texts both tokenizers must encode alike (code, prose and digits, text beyond ASCII)."""


def tokenizer_mismatch(draft_tokenizer, target_tokenizer) -> Optional[str]:
    """How a draft model's tokenizer differs from the target's (its size, the ids of the target's special tokens, a
    probe text's ids), or None when they agree."""
    if len(draft_tokenizer) != len(target_tokenizer):
        return f"its tokenizer holds {len(draft_tokenizer)} tokens, the target's {len(target_tokenizer)}"
    for token in target_tokenizer.all_special_tokens:
        draft_id = draft_tokenizer.convert_tokens_to_ids(token)
        target_id = target_tokenizer.convert_tokens_to_ids(token)
        if draft_id != target_id:
            return f"it has special token {token!r} at id {draft_id}, the target at {target_id}"
    for text in PROBES:
        draft_ids = draft_tokenizer(text, add_special_tokens=False)["input_ids"]
        target_ids = target_tokenizer(text, add_special_tokens=False)["input_ids"]
        if draft_ids != target_ids:
            at = next((i for i, (a, b) in enumerate(zip(draft_ids, target_ids)) if a != b),
                      min(len(draft_ids), len(target_ids)))
            return f"it encodes {text[:24]!r}... as {draft_ids[at:at + 4]} from token {at}, the target as " \
                   f"{target_ids[at:at + 4]}"
    return None


@functools.lru_cache(maxsize=2)
def small_model(path: str, device: torch.device, dtype: str) -> LoadedTarget:
    """The small model at `path`, loaded once a process per (device, dtype): several runtimes (one per shape or
    policy, and the float32 check's) draft with it, each over its own copy of its weights (`from_hf` copies)."""
    return load_target(TargetConfig(path=path), device=device, dtype=dtype, require_chat_template=False)


def load_draft_model(path: str, target: LoadedTarget, target_model: VerifierModel, max_len: int,
                     dtype: str) -> DraftModelDrafter:
    """runtime.draft_model at `path` (hub id, directory, GGUF or pkg:MODEL) as a drafter for `target`, on the
    target's device in `dtype`; a model of another tokenizer is one line."""
    small = small_model(path, target_model.device, dtype)
    mismatch = tokenizer_mismatch(small.tokenizer, target.tokenizer)
    if mismatch is not None:
        raise SpecdraftError(f"runtime.draft_model={path} does not share the target's tokenizer (vocabulary "
                             f"{small.info.vocab_size}, the target's {target.info.vocab_size}): {mismatch}; a draft "
                             f"model must be of the target's own tokenizer")
    model = from_hf(small.model, small.info)
    return DraftModelDrafter(model, hf_rope_tables(small.model, max_len), target.info.vocab_size,
                             cost_in_target_layers(model, target_model))

