"""A prompt's prefill, before speculative and plain decoding alike (`Prefill`): the drafter's `begin` with the
prompt's extra context, the prompt through the target (its cache filled from slot 0, the first new token sampled),
then its features to the drafter (`Drafter.ingest_prompt`) and to an intermediate model.

With CUDA graphs the target's pass and the drafter's ingest each run in a graph captured per prompt length rounded
up to a multiple of PREFILL_ROWS: the rows past the prompt are padding that causal attention keeps out of the
prompt's rows, and whose cache slots are rewritten before anything reads them. Eager, a prefill is a few hundred
small launches, bound by the host that issues them.
"""
from __future__ import annotations

from typing import Callable, Mapping, Optional, Tuple

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from specdraft.core.drafting import PROMPT_IDS
from specdraft.decoding.cycles.context import CycleContext
from specdraft.decoding.sampling import sample_token

# Not cuDNN's attention, which builds a plan for each new prompt length: every new length's first prefill would
# pay for it.
PREFILL_ATTENTION = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
PREFILL_ROWS = 64


class Prefill:
    """The prefill of one engine's context; a prompt's rows round up to a multiple of `rows` (1: no padding, eager
    runs) within the cache's `max_len` slots."""

    def __init__(self, context: CycleContext, rows: int, max_len: int):
        self.context, self.rows, self.max_len = context, rows, max_len

    @torch.no_grad()
    def run(self, prompt_ids: torch.Tensor, temperature: float, generator=None,
            prompt_embeds: Optional[torch.Tensor] = None, drafter_context: Optional[Mapping[str, torch.Tensor]] = None,
            prompt_rope: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
            meanwhile: Optional[Callable[[], None]] = None) -> int:
        """prompt_ids [P] on the device through the target and the drafter -> the first new token.
        `prompt_embeds` [P, H] replaces the target's embeddings of the prompt (image features in a vision-language
        prompt, say); `drafter_context` is the drafter's extra prompt context (`Drafter.begin`); `prompt_rope` (cos,
        sin [max_len, D]) the target's rotary tables for this prompt (an M-RoPE target's image prompt; None: the
        defaults). `meanwhile`: host work run while the device prefills (after its work is queued, before the
        first token is read)."""
        context, n = self.context, prompt_ids.shape[0]
        drafter = context.drafter
        context.target.use_rope(prompt_rope)
        rows = min(-(-n // self.rows) * self.rows, self.max_len)
        padded = torch.nn.functional.pad(prompt_ids, (0, rows - n)) if rows > n else prompt_ids  # [R]
        count = torch.full((1,), n, dtype=torch.long, device=context.device)
        if drafter is not None:
            ids = {PROMPT_IDS: prompt_ids} if PROMPT_IDS in drafter.caps.context else {}  # declared: asked for
            drafter.begin({**ids, **(drafter_context or {})})
        with sdpa_kernel(PREFILL_ATTENTION):
            if prompt_embeds is None:
                last_logits, *features = context.graphed(f"prefill@{rows}", self._target_pass, padded, count)
            else:
                embeds = torch.nn.functional.pad(prompt_embeds.to(context.target.dtype), (0, 0, 0, rows - n))  # [R, H]
                last_logits, *features = context.graphed(f"prefill-embeds@{rows}", self._embedded_pass, embeds, count)
            context.root.copy_(sample_token(last_logits, temperature, generator))
            if drafter is not None:
                context.graphed(f"ingest@{rows}", self._drafter_ingest, padded, count, *features)
            if context.stage is not None:
                context.graphed(f"stage@{rows}", self._stage_prefill, padded, count, *features)
        context.prefix_len.fill_(n)
        if meanwhile is not None:
            meanwhile()
        return int(context.root)

    def _target_pass(self, prompt_ids: torch.Tensor, count: torch.Tensor):
        """prompt_ids [R]: the prompt's count [1] tokens, then padding -> `_embedded_pass` of their embeddings."""
        return self._embedded_pass(self.context.target.embed(prompt_ids), count)

    def _embedded_pass(self, embeds: torch.Tensor, count: torch.Tensor):
        """embeds [R, H]: the prompt's count [1] rows, then padding -> (the last prompt token's logits [1, V], then
        the drafter's features [R, H] in `capture` order), the target's cache filled from slot 0."""
        context = self.context
        context.prefix_len.zero_()
        positions = torch.arange(embeds.shape[0], device=context.device)  # [R]
        hidden, captured = context.target.run_layers(embeds, positions, context.prefix_len, None,
                                                     capture=context.capture)
        return (context.target.logits(hidden.index_select(0, count - 1)), *(captured[i] for i in context.capture))

    def _drafter_ingest(self, prompt_ids: torch.Tensor, count: torch.Tensor, *features: torch.Tensor) -> None:
        """The prompt's features to the drafter: row i's next token is prompt token i + 1, the root after the last."""
        context = self.context
        rows = torch.arange(prompt_ids.shape[0], device=context.device)  # [R]
        next_tokens = torch.where(rows == count - 1, context.root, prompt_ids.roll(-1))  # [R]
        context.drafter.ingest_prompt(dict(zip(context.capture, features)), next_tokens,
                                      torch.zeros_like(context.prefix_len), count)

    def _stage_prefill(self, prompt_ids: torch.Tensor, count: torch.Tensor, *features: torch.Tensor) -> None:
        context = self.context
        context.stage.prefill(prompt_ids, count, dict(zip(context.capture, features)))
