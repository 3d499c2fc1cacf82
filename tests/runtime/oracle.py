"""A drafter that knows the answer: it drafts the target's own greedy continuation (precomputed), optionally
ranking a wrong token first at some positions. It exercises the engine's acceptance, tree and cache logic with
known acceptance patterns, independently of any trained draft."""
from __future__ import annotations

from typing import List

import torch

from specdraft.core.drafting import Drafter


class OracleDrafter(Drafter):
    def __init__(self, sequence: List[int], vocab_size: int, wrong_every: int = 0):
        """sequence: prompt + the target's greedy continuation; wrong_every: positions p with p % wrong_every == 0
        get a wrong token ranked first (the right one second)."""
        self.sequence = torch.tensor(sequence + [0] * 64)
        self.vocab_size, self.wrong_every = vocab_size, wrong_every
        self.feature_layers = [1]
        self.d2t = torch.zeros(vocab_size, dtype=torch.long)

    def allocate(self, max_len, scratch, device, dtype):
        self.sequence, self.d2t = self.sequence.to(device), self.d2t.to(device)
        self.ingested = []

    def ingest(self, features, next_tokens, start, count):
        self.ingested.append((int(start), int(count), next_tokens[:int(count)].tolist()))

    def _logits(self, positions: torch.Tensor) -> torch.Tensor:  # [k] -> [k, V]
        right = self.sequence[positions + 1]
        logits = torch.zeros(positions.shape[0], self.vocab_size, device=positions.device)
        logits[torch.arange(positions.shape[0], device=positions.device), right] = 10.0
        if self.wrong_every:
            wrong = (right + 1) % self.vocab_size
            flip = (positions % self.wrong_every) == 0
            logits[flip, wrong[flip]] = 12.0
        return logits

    def first(self, root_token, position):
        return self._logits(position), torch.zeros(1, 4, device=position.device)

    def step(self, depth, hidden, tokens, positions, scratch_slots, scratch_visible):
        return self._logits(positions), torch.zeros(positions.shape[0], 4, device=positions.device)
