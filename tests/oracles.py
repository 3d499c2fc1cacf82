"""Plain chain drafters written from each method's training modules, one drafting step at a time over Hugging Face
features: the oracles the runtime drafters (the methods' only inference path) are checked against.

`ChainState` is what a chain drafter sees at the start of a cycle (batch 1); each `*_chain(draft, state, k)`
returns the [k] greedy target-vocabulary ids it drafts after `state.tokens`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from specdraft.core.types import DraftBatch, TargetFeatures
from specdraft.methods.dflash import DFlashDraft
from specdraft.methods.dflash.blocks import BlockMask
from specdraft.methods.eagle3 import Eagle3Draft, fused_features
from specdraft.methods.kangaroo import KangarooDraft
from specdraft.methods.peagle import PEagleDraft, Rollout, rollout_hidden
from specdraft.methods.poss import PossDraft, PrefixKeys
from specdraft.methods.vispec import VispecDraft, draft_columns
from tests.partial_layers import new_layer_cache, run_first_layers


@dataclass
class ChainState:
    tokens: torch.Tensor  # [1, n + 1] every token so far, the newest (not yet seen by the target) last
    features: TargetFeatures  # hidden_states over the first n tokens: [1, n, H] each
    embed: Callable[[torch.Tensor], torch.Tensor]  # target embedding: [1, k] ids -> [1, k, H]
    lm_head: Optional[torch.Tensor] = None  # [V, H] the target's LM head (a draft that shares it reads it)


def _to_target(draft, draft_logits: torch.Tensor) -> torch.Tensor:
    draft_index = draft_logits[0, -1].argmax()
    return draft_index + draft.d2t[draft_index]  # target id


@torch.no_grad()
def eagle3_chain(draft: Eagle3Draft, state: ChainState, num_tokens: int) -> torch.Tensor:
    hidden = fused_features(draft, state.features.hidden_states)  # [1, n, H]
    cols = torch.arange(hidden.shape[1], device=hidden.device)
    embeds = state.embed(state.tokens[:, 1:]).to(hidden.dtype)  # column t sees token t+1
    hidden, kv = draft.step(hidden, embeds, cols, cols, [])
    return _chain_steps(draft, state, hidden[:, -1:], kv, cols[-1:], cols[-1:], num_tokens)


def _chain_steps(draft, state: ChainState, hidden, kv, last_col, last_position, num_tokens: int, feed=None):
    """After step 0 over the prefix (its last column's state hidden [1, 1, H], its keys kv): the chain, each drafted
    token at rotary position last_position + its depth - 1 beside column last_col; `feed` maps a fed-back state."""
    cache, drafted = [kv], []
    for step in range(num_tokens):
        drafted.append(_to_target(draft, draft.logits(hidden)))
        if step + 1 == num_tokens:
            break
        embeds = state.embed(drafted[-1].view(1, 1)).to(hidden.dtype)
        hidden = draft.fed_back(hidden)  # EAGLE-3.1's norm_output: the normed state
        hidden, kv = draft.step(feed(hidden) if feed else hidden, embeds, last_position + step + 1, last_col, cache)
        cache.append(kv)
    return torch.stack(drafted)


@torch.no_grad()
def poss_chain(draft: PossDraft, state: ChainState, num_tokens: int) -> torch.Tensor:
    fused = fused_features(draft, state.features.hidden_states)  # [1, n, H]
    cols = torch.arange(fused.shape[1], device=fused.device)
    first_embeds = state.embed(state.tokens[:, 1:]).to(fused.dtype)  # column t sees token t+1
    hidden, step0_kv = draft.step(fused, first_embeds, cols, cols, [], specialist=0)
    prefix = PrefixKeys(draft, fused, first_embeds, cols)
    prefix.by_specialist[0] = step0_kv
    hidden, last_col, drafted_kv = hidden[:, -1:], cols[-1:], []
    drafted = [_to_target(draft, draft.logits(hidden))]
    for step in range(1, num_tokens):
        specialist = draft.specialist_for(step)
        embeds = state.embed(drafted[-1].view(1, 1)).to(hidden.dtype)
        hidden, kv = draft.step(hidden, embeds, last_col + step, last_col, [prefix[specialist], *drafted_kv],
                                specialist=specialist)
        drafted_kv.append(kv)
        drafted.append(_to_target(draft, draft.logits(hidden)))
    return torch.stack(drafted)


@torch.no_grad()
def kangaroo_chain(draft: KangarooDraft, state: ChainState, num_tokens: int) -> torch.Tensor:
    """The target's layers 0..ℓ-1 run on the root and each drafted token (their cache rebuilt over the prefix each
    call); the adapter reads feature ℓ of the confirmed tokens."""
    logits_fn, model = draft.target_logits_fn(), draft.target_model
    positions = torch.arange(state.tokens.shape[1], device=state.tokens.device)  # the root x_n is at position n
    shallow_cache = new_layer_cache(model)
    root = run_first_layers(model, state.embed(state.tokens), positions, shallow_cache, draft.exit_layer)[:, -1:]
    prefix = state.features.hidden_states[draft.exit_layer]  # [1, n, H]
    hidden, adapter_kv = draft(torch.cat([prefix, root], dim=1), positions)
    drafted = [_to_target(draft, logits_fn(hidden))]
    for step in range(1, num_tokens):
        position = positions[-1:] + step
        shallow = run_first_layers(model, state.embed(drafted[-1].view(1, 1)), position, shallow_cache,
                                   draft.exit_layer)
        hidden, adapter_kv = draft(shallow, position, adapter_kv)
        drafted.append(_to_target(draft, logits_fn(hidden)))
    return torch.stack(drafted)


@torch.no_grad()
def vispec_prefix_step(draft: VispecDraft, state: ChainState):
    """Step 0 over the prefix in the draft's own columns (the training side's `draft_columns`: each image's span
    replaced by its stand-ins, which skip img_fc), column c reading the token after its target position p(c) at
    rotary position p(c) -> (its states [1, n', H], its keys, columns [n'], positions p [n'], global features)."""
    n = state.tokens.shape[1] - 1
    ones = torch.ones_like(state.tokens[:, :n])
    columns = draft_columns(draft, DraftBatch(state.tokens[:, :n], ones, ones, state.features))
    kept = int(columns.batch.attention_mask.sum())  # n' columns, then padding
    fused = fused_features(draft, {i: h[:, :kept] for i, h in columns.batch.features.hidden_states.items()})
    global_features = columns.global_features[:, :kept]  # [1, n', H]
    hidden = draft.with_image(fused, global_features)
    hidden = torch.where(columns.standin_mask[:, :kept, None], columns.standins[:, :kept].to(hidden.dtype), hidden)
    cols = torch.arange(kept, device=hidden.device)
    positions = cols if columns.batch.position_ids is None else columns.batch.position_ids[0, :kept]  # [n'] p(c)
    embeds = state.embed(state.tokens[:, positions + 1]).to(hidden.dtype)  # the token after each column's position
    hidden, kv = draft.step(hidden, embeds, positions, cols, [])
    return hidden, kv, cols, positions, global_features


@torch.no_grad()
def vispec_chain(draft: VispecDraft, state: ChainState, num_tokens: int) -> torch.Tensor:
    """`vispec_prefix_step`, then a chain, every fed-back state through img_fc with the last image's global
    feature."""
    hidden, kv, cols, positions, global_features = vispec_prefix_step(draft, state)
    last_global = global_features[:, -1:]
    return _chain_steps(draft, state, hidden[:, -1:], kv, cols[-1:], positions[-1:], num_tokens,
                        feed=lambda fed_back: draft.with_image(fed_back, last_global))


@torch.no_grad()
def peagle_chain(draft: PEagleDraft, state: ChainState, num_tokens: int) -> torch.Tensor:
    """The training side's rollout forward over the prefix, with num_tokens - 1 mask rows at its last column: depth 1
    from that column, depths 2.. from the mask rows, all in one call."""
    fused = fused_features(draft, state.features.hidden_states)  # [1, n, H]
    n, masked = fused.shape[1], num_tokens - 1
    next_embeds = state.embed(state.tokens[:, 1:]).to(fused.dtype)  # column t sees token t+1
    anchors = torch.tensor([list(range(n)) + [n - 1] * masked], device=fused.device)  # [1, n + k - 1]
    groups = torch.tensor([[0] * n + list(range(1, num_tokens))], device=fused.device)
    parents = [torch.tensor([[n - 1 if group == 1 else 0]], device=fused.device) for group in range(1, num_tokens)]
    rollout = Rollout(anchors=anchors, groups=groups, sizes=[n] + [1] * masked, parents=parents)
    mask_embed = state.embed(torch.tensor([[draft.mask_token_id]], device=fused.device))[0, 0]
    hidden = rollout_hidden(draft, rollout, fused, next_embeds, mask_embed, anchors[:, :n], None, "dense")
    logits = draft.logits(hidden[0, n - 1:])  # [k, Vd]: the prefix's last column, then the mask rows
    draft_index = logits.argmax(-1)
    return draft_index + draft.d2t[draft_index]



def dflash_chain(draft: DFlashDraft, state: ChainState, num_tokens: int) -> torch.Tensor:
    """One block with its anchor at the root x_n (position n) through the training forward: the context of the n
    confirmed positions, the block [x_n, mask, ...] seeing all of it and itself -> the argmax of positions 1..k."""
    n, block = state.tokens.shape[1] - 1, draft.block_size
    context = draft.context(state.features.hidden_states)  # [1, n, H]
    tokens = torch.full((1, block), draft.mask_token_id, dtype=torch.long, device=state.tokens.device)
    tokens[0, 0] = state.tokens[0, n]
    positions = torch.arange(n, n + block, device=tokens.device)[None]  # [1, B]
    sees = BlockMask(dense=torch.ones(1, block, n + block, dtype=torch.bool, device=tokens.device))
    normed = draft.blocks(state.embed(tokens), positions, context, positions.new_tensor(range(n))[None], sees)
    logits = draft.logits(normed[:, 1:1 + num_tokens], state.lm_head)  # [1, k, Vd]
    best = logits[0].argmax(-1)
    return best + draft.d2t[best]


CHAINS = {"eagle3": eagle3_chain, "poss": poss_chain, "kangaroo": kangaroo_chain, "vispec": vispec_chain,
          "peagle": peagle_chain, "dflash": dflash_chain}


def chain_of(method: str):
    """The oracle chain drafter of a registered method (every method needs one here)."""
    return CHAINS[method]
