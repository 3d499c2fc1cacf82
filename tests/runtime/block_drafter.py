"""A fake block drafter (core/drafting.py's block_size contract), independent of any trained draft: each position's
proposal is a row of random logits drawn once from a fixed generator, with the target's own next token (known in
advance, as the oracle drafter's) boosted at most positions, so that cycles accept some blocks deep and reject
others at every depth."""
from __future__ import annotations

from typing import List

import torch

from specdraft.core.drafting import Drafter, DrafterCaps


class RandomBlockDrafter(Drafter):
    def __init__(self, sequence: List[int], vocab_size: int, block_size: int = 5, wrong_every: int = 3,
                 seed: int = 0, max_positions: int = 1024):
        """sequence: prompt + the target's greedy continuation; positions p with p % wrong_every == 0 keep their
        random row alone (the right token is then the draft's pick by chance only); 0: boost every position."""
        self.caps = DrafterCaps(block_size=block_size)
        self.vocab_size, self.wrong_every = vocab_size, wrong_every
        generator = torch.Generator().manual_seed(seed)
        self.table = torch.randn(max_positions, vocab_size, generator=generator) * 2.0  # [P, Vd]
        self.sequence = torch.tensor(sequence + [0] * max_positions)[:max_positions]
        self.feature_layers = [1]
        self.d2t = torch.zeros(vocab_size, dtype=torch.long)
        self.ingested = []
        self.offsets = torch.arange(1, block_size)  # [B - 1]

    def allocate(self, max_len, scratch, device, dtype):
        self.table, self.sequence = self.table.to(device), self.sequence.to(device)
        self.d2t, self.offsets = self.d2t.to(device), self.offsets.to(device)
        self.ingested = []

    def ingest(self, features, next_tokens, start, count):
        self.ingested.append((int(start), int(count)))

    def proposal_logits(self, positions: torch.Tensor) -> torch.Tensor:
        """positions [R] -> [R, Vd]: each position's random row, its right token boosted where it is boosted."""
        logits = self.table[positions].clone()
        right = self.sequence[positions]
        boost = torch.ones_like(positions, dtype=torch.bool) if not self.wrong_every else \
            (positions % self.wrong_every) != 0
        rows = torch.arange(positions.shape[0], device=positions.device)
        logits[rows, right] += torch.where(boost, 12.0, 0.0)
        return logits

    def propose(self, root_token, prefix_len):
        return self.proposal_logits(prefix_len + self.offsets)  # [B - 1, Vd]: positions n + 1 .. n + B - 1
