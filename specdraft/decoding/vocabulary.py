"""The draft vocabulary's map to the target's, as the engine trusts it (`checked_d2t`).

A draft proposes draft indices; index i is target token i + d2t[i] (FR-Spec's reduced vocabulary, methods/shared.py).
The engine embeds those ids in the target, compares them with the target's choices and, at T > 0, spreads the
draft's q over them, so it needs every index to map to a target id in [0, V) and no two indices to one id (two
siblings of one token would be tested twice: the sampled walk's rule holds for distinct children only). A map
that breaks either (a corrupt or a hostile export) is repaired once, on the host, when the engine first drafts
with it: each index that maps outside the vocabulary or onto an id an earlier index took maps instead to an id no
index takes. Such an index then proposes a real token the draft did not mean, which the target verifies as any
other: it can cost acceptance, never change what the target emits. A valid map is used as it is (the same
tensor: nothing changes on the hot path).
"""
from __future__ import annotations

import logging

import torch

from specdraft.core.errors import SpecdraftError

logger = logging.getLogger(__name__)


def checked_d2t(d2t: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """d2t [Vd] int64 (target id = index + d2t[index]) -> d2t itself when it maps every index to its own target
    id in [0, vocab_size), else a repaired copy on its device (module docstring). A draft vocabulary larger than
    the target's can map to no distinct ids: one line says so."""
    draft_vocab = d2t.shape[0]
    if draft_vocab > vocab_size:
        raise SpecdraftError(f"the draft's vocabulary has {draft_vocab} ids, more than the target's {vocab_size}: "
                             f"it was made for another target")
    target_ids = (torch.arange(draft_vocab, device=d2t.device) + d2t).cpu()  # [Vd] the one host read
    outside = (target_ids < 0) | (target_ids >= vocab_size)
    ids = torch.where(outside, vocab_size, target_ids)  # [Vd] the outside ones at one id past the vocabulary
    order = torch.sort(ids, stable=True).indices  # equal ids keep index order: the first one keeps its id
    ordered = ids[order]
    repeated = torch.cat([torch.zeros(1, dtype=torch.bool), ordered[1:] == ordered[:-1]])  # [Vd] in sorted order
    bad = torch.zeros(draft_vocab, dtype=torch.bool)
    bad[order] = repeated | (ordered == vocab_size)
    if not bad.any():
        return d2t
    taken = torch.zeros(vocab_size, dtype=torch.bool)
    taken[ids[~bad]] = True
    repaired = target_ids.clone()
    repaired[bad] = (~taken).nonzero()[:int(bad.sum()), 0]  # ids no index takes: enough of them (Vd <= V)
    logger.warning("the draft's vocabulary map (d2t) sends %d of its %d ids outside the target's %d or onto an id "
                   "another takes; they propose unused target ids instead (acceptance may drop, the output stays "
                   "the target's)", int(bad.sum()), draft_vocab, vocab_size)
    return (repaired - torch.arange(draft_vocab)).to(d2t.device)
