"""Bulk generation, many prompts at once (`distill-data`'s static engine): the runtime's compact target
(verifier/: fused weights, its kernels) over a static KV cache of many sequences, CUDA graphs and continuous
batching. Greedy answers are the target's greedy answers, as Hugging Face `generate` gives them; sampled answers
follow its temperature / top-p distribution (`sampling.sample_rows`).

The cache holds `rows` sequences of `row_len` slots each, end to end: [L, Hkv, (rows + 1) * row_len, D]. Row r's
token at position p sits at slot r * row_len + p, so `rope_cache` writes it as it writes the runtime's single
sequence, and `kernels.ragged_attention` lets each query see its own row alone. The last row is scratch: the
padding entries of a step's batch point there.

One forward runs N tokens of any rows at any positions: a decode step (the newest token of each active row) or a
packed prefill (every token of some new prompts, each in the row it takes: causal within its prompt). The device
holds each row's newest token and position; a decode step gathers them for the active rows (a list of row
indices padded with the scratch row to a bucket size), picks each row's next token and writes both back, so
steps follow one another without the host. On a GPU each bucket size's step is a CUDA graph; prefills run eager.

Continuous batching (`BatchedGenerator.generate`): an answer that ends (EOS or max_new_tokens) frees its row, and
once enough rows are free the next prompts are prefilled into them, so the batch stays full as answers finish.
The host keeps one step in flight: it queues step k+1 before it reads step k's tokens (a finished row runs one
step more than it needs; that token is dropped).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from functools import partial
from itertools import chain
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from specdraft.core.types import TargetInfo
from specdraft.kernels.launch import next_power_of_2
from specdraft.kernels.ragged_attention import ragged_attention
from specdraft.decoding.graphs import CallGraph
from specdraft.decoding.sampling import sample_rows
from specdraft.decoding.verifier import VerifierModel, from_hf, hf_rope_tables
from specdraft.decoding.verifier import unsupported_reason as verifier_unsupported
from specdraft.decoding.verifier.model import effective_windows, rope_kinds

SMALLEST_BUCKET = 8  # decode steps run 8, 16, 32, ... rows (or all rows): one graph each
PREFILL_TOKENS = 16384  # the most prompt tokens one packed prefill runs (its activations' memory)
ROW_ROUNDING = 256  # row lengths round up to a multiple of this, so a longer prompt seldom re-allocates the cache


class BatchedDecoder:
    """The device side: the cache, one forward over packed tokens, prefills and graphed decode steps.
    `rope_tables(n)` -> (cos, sin) [n, D], the target's own rotary tables for n positions."""

    def __init__(self, target: VerifierModel, rope_tables: Callable[[int], Tuple[torch.Tensor, torch.Tensor]],
                 use_graphs: Optional[bool] = None):
        self.target, self.rope_tables = target, rope_tables
        self.device, self.dtype = target.device, target.dtype
        self.use_graphs = self.device.type == "cuda" if use_graphs is None else use_graphs
        self.rows, self.row_len = 0, 0
        self._graphs: Dict[tuple, CallGraph] = {}

    def allocate(self, rows: int, row_len: int) -> None:
        """Room for `rows` sequences of up to `row_len` tokens (kept when the current cache is big enough)."""
        if rows <= self.rows and row_len <= self.row_len:
            return
        info = self.target.info
        self.rows, self.row_len = max(rows, self.rows), max(-(-row_len // ROW_ROUNDING) * ROW_ROUNDING, self.row_len)
        self._graphs.clear()  # they hold the old buffers
        self.k_cache = self.v_cache = None  # freed before the new ones are made
        shape = (info.num_layers, info.num_kv_heads, (self.rows + 1) * self.row_len, info.head_dim)
        self.k_cache = torch.zeros(shape, device=self.device, dtype=self.dtype)
        self.v_cache = torch.zeros_like(self.k_cache)
        cos, sin = (table.to(self.device, self.dtype) for table in self.rope_tables(self.row_len))
        self.ropes = list(zip(*rope_kinds(cos, sin)))  # [(cos, sin) [row_len, D]] per rotary kind
        self.sliding_windows = effective_windows(self.target.architecture, self.row_len)
        self.scratch = self.rows  # the padding row
        self.row_token = torch.zeros(self.rows + 1, dtype=torch.long, device=self.device)  # newest token per row
        self.row_pos = torch.zeros_like(self.row_token)  # its position (the cache slot it goes to)
        self.active = torch.full((self.rows,), self.scratch, dtype=torch.long, device=self.device)
        self.uniforms = torch.zeros(self.rows, dtype=torch.float32, device=self.device)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """tokens, positions, rows [N] int64 -> hidden [N, H] after the last layer (before the final norm). Writes
        each token's keys and values at its row and position; each attends to its row up to itself."""
        starts = rows * self.row_len  # [N]
        slots, lengths = starts + positions, positions + 1  # [N]
        hidden, pending = self.target.embed(tokens), None
        for layer, k_cache, v_cache, window in zip(self.target.layers, self.k_cache, self.v_cache,
                                                   self.sliding_windows):
            hidden, q = layer.attention_input(hidden, pending, self.ropes[layer.kind.rope], positions, k_cache,
                                              v_cache, slots)
            attn = ragged_attention(q, k_cache, v_cache, starts, lengths, layer.scale, self.row_len,
                                    sliding_window=window)
            hidden, pending = layer.attention_output(attn, hidden)
        return hidden + pending

    def prefill(self, prompts: Sequence[Sequence[int]], rows: Sequence[int], temperature: float, top_p: float,
                generator: Optional[torch.Generator], states: Optional[List[torch.Tensor]] = None) -> torch.Tensor:
        """Prompts into the given rows, packed in one forward (eager) -> [k] their first new tokens (on the device,
        also the rows' newest tokens). `states`, when given, gets the prompts' last states [k, H] appended (the
        last layer's output before the final norm)."""
        lengths = [len(prompt) for prompt in prompts]
        host = torch.tensor([list(chain.from_iterable(prompts)), [p for n in lengths for p in range(n)],
                             [r for r, n in zip(rows, lengths) for _ in range(n)]], dtype=torch.long)  # [3, N]
        tokens, positions, token_rows = _to_device(host, self.device)
        ends = _to_device(torch.tensor([rows, lengths], dtype=torch.long), self.device)  # [2, k]
        last = torch.cumsum(ends[1], 0) - 1  # [k] each prompt's last token
        hidden = self.forward(tokens, positions, token_rows).index_select(0, last)  # [k, H]
        if states is not None:
            states.append(hidden)
        uniforms = self._draw(len(prompts), temperature, generator)
        first = sample_rows(self.target.logits(hidden), temperature, top_p, uniforms)  # [k]
        self.row_token.index_copy_(0, ends[0], first)
        self.row_pos.index_copy_(0, ends[0], ends[1])
        return first

    def step(self, rows: Sequence[int], temperature: float, top_p: float,
             generator: Optional[torch.Generator]) -> torch.Tensor:
        """One decode step of the given rows -> [bucket] next tokens on the device, the first len(rows) theirs
        (the rest are the scratch row's padding)."""
        bucket = min(next_power_of_2(max(len(rows), SMALLEST_BUCKET)), self.rows)
        padded = list(rows) + [self.scratch] * (bucket - len(rows))
        self.active[:bucket].copy_(_pinned(torch.tensor(padded, dtype=torch.long), self.device), non_blocking=True)
        self._draw(len(rows), temperature, generator)  # the padding's are never read: draws depend on rows alone
        body = partial(self._step_body, bucket, temperature, top_p)
        if not self.use_graphs:
            return body()
        key = (bucket, temperature, top_p)
        if key not in self._graphs:
            self._graphs[key] = CallGraph(body, [self.row_token, self.row_pos])
        return self._graphs[key]()

    def _step_body(self, bucket: int, temperature: float, top_p: float) -> torch.Tensor:
        rows = self.active[:bucket]  # [b]
        positions = self.row_pos.index_select(0, rows)  # [b]
        hidden = self.forward(self.row_token.index_select(0, rows), positions, rows)  # [b, H]
        tokens = sample_rows(self.target.logits(hidden), temperature, top_p, self.uniforms[:bucket])  # [b]
        self.row_token.index_copy_(0, rows, tokens)  # padding entries all write the scratch row: any value wins
        self.row_pos.index_copy_(0, rows, positions + 1)
        self.row_pos[self.scratch:].zero_()  # the scratch row never leaves its first slot
        return tokens

    def _draw(self, count: int, temperature: float, generator: Optional[torch.Generator]) -> torch.Tensor:
        """The next `count` uniforms for sampling, drawn outside any graph from `generator` (none at T=0)."""
        if temperature > 0:
            self.uniforms[:count].uniform_(generator=generator)
        return self.uniforms[:count]


def _pinned(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor ready for a copy that does not wait: pinned when it goes to a GPU."""
    return host.pin_memory() if device.type == "cuda" else host


def _to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    return _pinned(host, device).to(device, non_blocking=True)


@dataclass
class _Staged:
    """Tokens on their way to the host (a copy that does not wait), and the request each belongs to (-1: none)."""
    values: torch.Tensor
    event: Optional[torch.cuda.Event]
    requests: List[int]

    @classmethod
    def of(cls, tokens: torch.Tensor, requests: List[int]) -> "_Staged":
        if tokens.device.type != "cuda":
            return cls(tokens.cpu(), None, requests)
        values = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
        values.copy_(tokens, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return cls(values, event, requests)

    def read(self) -> List[Tuple[int, int]]:
        """(request, token) pairs, once the copy is done."""
        if self.event is not None:
            self.event.synchronize()
        return [(r, t) for r, t in zip(self.requests, self.values.tolist()) if r >= 0]


@dataclass
class _Batch:
    """The host's view of one `generate` call: answers so far, which request each row holds, what waits."""
    prompts: Sequence[Sequence[int]]
    max_new_tokens: int
    eos_ids: frozenset
    rows: int
    answers: List[List[int]] = field(default_factory=list)
    done: List[bool] = field(default_factory=list)
    holder: Dict[int, int] = field(default_factory=dict)  # row -> its live request
    row_of: Dict[int, int] = field(default_factory=dict)  # live request -> its row
    free: List[int] = field(default_factory=list)
    waiting: deque = field(default_factory=deque)

    def __post_init__(self):
        self.answers = [[] for _ in self.prompts]
        self.done = [False] * len(self.prompts)
        self.free = list(range(self.rows - 1, -1, -1))
        self.waiting = deque(range(len(self.prompts)))

    def refill_size(self, refill: int) -> int:
        """How many waiting prompts to prefill now: none until `refill` rows are free (or every waiting prompt
        fits, or no row is busy), then as many as there are free rows."""
        wanted = min(len(self.free), len(self.waiting))
        return wanted if wanted and (wanted >= refill or wanted == len(self.waiting) or not self.holder) else 0

    def take(self, count: int) -> Tuple[List[int], List[int]]:
        """The next `count` waiting prompts (at most PREFILL_TOKENS tokens, one at least) -> (requests, rows)."""
        requests, tokens = [], 0
        while self.waiting and len(requests) < count:
            size = len(self.prompts[self.waiting[0]])
            if requests and tokens + size > PREFILL_TOKENS:
                break
            requests.append(self.waiting.popleft())
            tokens += size
        rows = [self.free.pop() for _ in requests]
        self.holder.update(zip(rows, requests))
        self.row_of.update(zip(requests, rows))
        return requests, rows

    def record(self, pairs: List[Tuple[int, int]]) -> None:
        """Append each live request's token; an answer ends at EOS (not kept) or at max_new_tokens."""
        for request, token in pairs:
            if self.done[request]:
                continue  # a step that was in flight when its answer ended
            if token not in self.eos_ids:
                self.answers[request].append(token)
            if token in self.eos_ids or len(self.answers[request]) >= self.max_new_tokens:
                self.done[request] = True
                row = self.row_of.pop(request)
                del self.holder[row]
                self.free.append(row)


class BatchedGenerator:
    """Answers to many prompts with `batch_size` rows kept busy. `refill`: free rows that trigger a prefill of
    waiting prompts (None: an eighth of the rows), a trade of idle rows against more, smaller prefills."""

    def __init__(self, decoder: BatchedDecoder, batch_size: int, refill: Optional[int] = None):
        self.decoder, self.batch_size = decoder, batch_size
        self.refill = refill or max(1, batch_size // 8)

    @torch.no_grad()
    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, eos_ids: Sequence[int] = (),
                 temperature: float = 0.0, top_p: float = 1.0, seed: int = 0,
                 last_states: Optional[Dict[int, torch.Tensor]] = None) -> List[List[int]]:
        """prompts: token ids -> each answer's new tokens, up to (not including) its first EOS, at most
        max_new_tokens. Sampling (T > 0) draws from a generator seeded with `seed`. `last_states`, when given,
        gets {prompt index: [H] the target's state at its last token, before the final norm} (on the device)."""
        if not prompts or max_new_tokens < 1:
            return [[] for _ in prompts]
        rows = min(self.batch_size, len(prompts))
        self.decoder.allocate(rows, max(len(p) for p in prompts) + max_new_tokens + 1)
        generator = None
        if temperature > 0:
            generator = torch.Generator(self.decoder.device).manual_seed(seed)
        batch = _Batch(prompts, max_new_tokens, frozenset(eos_ids), rows)
        sample = (temperature, top_p, generator)
        in_flight: deque = deque()
        while batch.holder or batch.waiting or in_flight:
            count = batch.refill_size(self.refill)
            if count:
                requests, rows_taken = batch.take(count)
                kept: Optional[List[torch.Tensor]] = None if last_states is None else []
                first = self.decoder.prefill([prompts[r] for r in requests], rows_taken, *sample, kept)
                if kept:
                    last_states.update(zip(requests, kept[0]))
                in_flight.append(_Staged.of(first, requests))
            live = sorted(batch.holder)
            if live:
                tokens = self.decoder.step(live, *sample)
                in_flight.append(_Staged.of(tokens, [batch.holder[row] for row in live]))
            while len(in_flight) > (1 if live else 0):  # keep the newest step in flight
                batch.record(in_flight.popleft().read())
        return batch.answers


def unsupported_reason(hf_model, info: TargetInfo, max_len: int) -> Optional[str]:
    """Why the compact target would not compute what this Hugging Face causal LM computes for sequences of up to
    `max_len` tokens, in a few words; None when it does (every family the verifier runs, sliding windows and
    mixtures of experts included)."""
    if getattr(hf_model, "hf_quantizer", None) is not None:
        return "quantized weights"
    return verifier_unsupported(hf_model, info)


def batched_generator(hf_model, info: TargetInfo, batch_size: int) -> BatchedGenerator:
    """A BatchedGenerator over a Hugging Face causal LM's weights (the verifier's fused copies, same device and
    dtype) and its own rotary tables."""
    return BatchedGenerator(BatchedDecoder(from_hf(hf_model, info), partial(hf_rope_tables, hf_model)), batch_size)
