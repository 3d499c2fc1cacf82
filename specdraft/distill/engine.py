"""distill-data's answer engine, `distill.engine`: Hugging Face `generate` (hf, specdraft/distill/run.py's own path)
or the static batched decoder (static: specdraft/decoding/batched.py, the runtime's compact target with a static
KV cache, CUDA graphs and continuous batching). auto takes static on a GPU for a target it reproduces, else hf.
"""
from __future__ import annotations

import logging
from typing import List, Optional

import torch

from specdraft.config import Recipe
from specdraft.core.errors import SpecdraftError
from specdraft.decoding.batched import BatchedGenerator, batched_generator, unsupported_reason
from specdraft.targets.load import LoadedTarget

log = logging.getLogger(__name__)


class StaticAnswers:
    """Answers of the static engine: each call's prompts all go to the generator, which keeps
    distill.batch_size rows busy."""

    def __init__(self, generator: BatchedGenerator, recipe: Recipe, eos_ids: List[int]):
        self.generator, self.cfg, self.eos_ids = generator, recipe.distill, eos_ids

    def answers(self, prompts: List[List[int]]) -> List[List[int]]:
        """Token ids of each answer, up to (not including) its first EOS. A sampled call draws its generator's
        seed from torch's global one, which each shard reseeds: a resumed shard samples the same."""
        seed = int(torch.randint(0, 2 ** 62, (1,)))
        return self.generator.generate(prompts, self.cfg.max_new_tokens, self.eos_ids, self.cfg.temperature,
                                       self.cfg.top_p, seed)


def static_engine(recipe: Recipe, target: LoadedTarget, eos_ids: List[int], device: str) -> Optional[StaticAnswers]:
    """The static engine when distill.engine picks it, else None (Hugging Face generate); the choice is logged.
    distill.engine=static for a target it cannot reproduce is a one-line error naming the key."""
    choice = recipe.distill.engine
    if choice == "hf":
        return None
    reason = unsupported_reason(target.model, target.info, recipe.data.max_length + recipe.distill.max_new_tokens)
    if target.processor is not None:
        reason = "a vision-language target's prompts carry images, which the static engine does not take"
    if choice == "static" and reason:
        raise SpecdraftError(f"distill.engine=static cannot run target {recipe.target.path}: {reason}; "
                             f"use distill.engine=hf or auto")
    if choice == "auto" and (reason or torch.device(device).type != "cuda"):
        log.info("distill.engine=auto: Hugging Face generate (%s)", reason or "the static engine pays on a GPU")
        return None
    log.info("distill.engine=%s: the static batched engine, %d rows", choice, recipe.distill.batch_size)
    return StaticAnswers(batched_generator(target.model, target.info, recipe.distill.batch_size), recipe, eos_ids)
