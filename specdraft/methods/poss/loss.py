"""PosS's training: EAGLE-3's training-time test with each step through its specialist, and EAGLE-3's loss over it."""
from __future__ import annotations

from typing import Dict, List, Optional

import torch
from torch.utils.checkpoint import checkpoint

from specdraft.methods.eagle3 import KV, eagle3_loss, ttt_inputs
from specdraft.methods.poss.config import PossConfig
from specdraft.methods.poss.model import PossDraft, PrefixKeys


def _checkpointed(step):
    """`step` under activation checkpointing (eagle3._checkpointed, with the specialist passed along)."""
    def run(hidden, embeds, positions, query_cols, cache, mask=None, specialist=0):
        return checkpoint(step, hidden, embeds, positions, query_cols, list(cache), mask=mask, specialist=specialist,
                          use_reentrant=False)
    return run


def poss_unroll(draft: PossDraft, hidden_states: Dict[int, torch.Tensor], steps: int,
                position_ids: Optional[torch.Tensor] = None, document_ids: Optional[torch.Tensor] = None,
                attention: str = "auto", logits: bool = True):
    """Training-time test through the specialists: yields each step's draft logits [B, T, Vd] (hidden states
    [B, T, H] with logits=False); column t of step i predicts x[t+2+i] and step i runs specialist_for(i).
    Packed rows, attention implementations and activation checkpointing as eagle3.ttt_unroll."""
    out = draft.logits if logits else (lambda hidden: hidden)
    ttt = ttt_inputs(draft, hidden_states, steps, position_ids, document_ids, attention, _checkpointed)
    fused, positions, cols, mask, run_step = ttt.fused, ttt.positions, ttt.cols, ttt.mask, ttt.run_step
    first_embeds = ttt.embeds(1)  # token x[t+1]
    hidden, step0_kv = run_step(fused, first_embeds, positions, cols, [], mask=mask, specialist=0)
    prefix = PrefixKeys(draft, fused, first_embeds, positions)
    prefix.by_specialist[0] = step0_kv
    yield out(hidden)
    drafted_kv: List[KV] = []
    for step in range(1, steps):
        specialist = draft.specialist_for(step)
        embeds = ttt.embeds(step + 1)  # token x[t+1+step]
        hidden, kv = run_step(hidden, embeds, positions + step, cols, [prefix[specialist], *drafted_kv], mask=mask,
                              specialist=specialist)
        drafted_kv.append(kv)
        yield out(hidden)


def poss_loss(draft: PossDraft, batch, cfg: PossConfig):
    """EAGLE-3's loss and metrics over the specialists' unroll."""
    return eagle3_loss(draft, batch, cfg, unroll=poss_unroll)
