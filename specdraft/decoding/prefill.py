"""A prompt's prefill, before speculative and plain decoding alike: the drafter's `begin` with the prompt's extra
context, the prompt through the target (its cache filled from slot 0, the first new token sampled), then its
features to the drafter (`Drafter.ingest_prompt`) and to an intermediate model.

With CUDA graphs the target's pass and the drafter's ingest each run in a graph captured per prompt length rounded
up to a multiple of PREFILL_ROWS: the rows past the prompt are padding that causal attention keeps out of the
prompt's rows, and whose cache slots are rewritten before anything reads them. Eager, a SmolLM2 prefill took 16 ms
a prompt for about 300 launches, host-bound, and was 19% of a prompt's speculative time.
"""
from __future__ import annotations

from functools import partial
from typing import Callable, Mapping, Optional, Tuple

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from specdraft.decoding.sampling import sample_token

# Not cuDNN's attention, which builds a plan for each new prompt length (on an H200: a prompt's first prefill 130-230
# ms against 20-40 ms again; 45-76 against 30-48 without cuDNN's attention).
PREFILL_ATTENTION = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
PREFILL_ROWS = 64


@torch.no_grad()
def prefill(engine, prompt_ids: torch.Tensor, temperature: float, generator=None,
            prompt_embeds: Optional[torch.Tensor] = None, context: Optional[Mapping[str, torch.Tensor]] = None,
            prompt_rope: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
            meanwhile: Optional[Callable[[], None]] = None) -> int:
    """prompt_ids [P] on the engine's device through a SpecEngine's target and drafter -> the first new token.
    `prompt_embeds` [P, H] replaces the target's embeddings of the prompt (image features in a vision-language
    prompt, say); `context` is the drafter's extra prompt context (`Drafter.begin`); `prompt_rope` (cos, sin
    [max_len, D]) the target's rotary tables for this prompt (an M-RoPE target's image prompt; None: the defaults).
    With graphs, the prompt is padded to a multiple of `engine.prefill_rows` rows. `meanwhile`: host work run while
    the device prefills (after its work is queued, before the first token is read)."""
    n = prompt_ids.shape[0]
    engine.target.use_rope(prompt_rope)
    rows = min(-(-n // engine.prefill_rows) * engine.prefill_rows, engine.max_len)
    padded = torch.nn.functional.pad(prompt_ids, (0, rows - n)) if rows > n else prompt_ids  # [R]
    count = torch.full((1,), n, dtype=torch.long, device=engine.device)
    if engine.drafter is not None:
        engine.drafter.begin(context or {})
    with sdpa_kernel(PREFILL_ATTENTION):
        if prompt_embeds is None:
            last_logits, *features = engine.graphed(f"prefill@{rows}", partial(_target_pass, engine), padded, count)
        else:
            embeds = torch.nn.functional.pad(prompt_embeds.to(engine.dtype), (0, 0, 0, rows - n))  # [R, H]
            last_logits, *features = engine.graphed(f"prefill-embeds@{rows}", partial(_embedded_pass, engine),
                                                    embeds, count)
        engine.root.copy_(sample_token(last_logits, temperature, generator))
        if engine.drafter is not None:
            engine.graphed(f"ingest@{rows}", partial(_drafter_ingest, engine), padded, count, *features)
        if engine.stage is not None:
            engine.graphed(f"stage@{rows}", partial(_stage_prefill, engine), padded, count, *features)
    engine.prefix_len.fill_(n)
    if meanwhile is not None:
        meanwhile()
    return int(engine.root)


def _target_pass(engine, prompt_ids: torch.Tensor, count: torch.Tensor):
    """prompt_ids [R]: the prompt's count [1] tokens, then padding -> `_embedded_pass` of their embeddings."""
    return _embedded_pass(engine, engine.target.embed(prompt_ids), count)


def _embedded_pass(engine, embeds: torch.Tensor, count: torch.Tensor):
    """embeds [R, H]: the prompt's count [1] rows, then padding -> (the last prompt token's logits [1, V], then the
    drafter's features [R, H] in `engine.capture` order), the target's cache filled from slot 0."""
    engine.prefix_len.zero_()
    positions = torch.arange(embeds.shape[0], device=engine.device)  # [R]
    hidden, captured = engine.target.run_layers(embeds, positions, engine.prefix_len, None, capture=engine.capture)
    return (engine.target.logits(hidden.index_select(0, count - 1)), *(captured[i] for i in engine.capture))


def _drafter_ingest(engine, prompt_ids: torch.Tensor, count: torch.Tensor, *features: torch.Tensor) -> None:
    """The prompt's features to the drafter: row i's next token is prompt token i + 1, the root after the last."""
    rows = torch.arange(prompt_ids.shape[0], device=engine.device)  # [R]
    next_tokens = torch.where(rows == count - 1, engine.root, prompt_ids.roll(-1))  # [R]
    engine.drafter.ingest_prompt(dict(zip(engine.capture, features)), next_tokens,
                                 torch.zeros_like(engine.prefix_len), count)


def _stage_prefill(engine, prompt_ids: torch.Tensor, count: torch.Tensor, *features: torch.Tensor) -> None:
    engine.stage.prefill(prompt_ids, count, dict(zip(engine.capture, features)))
