"""Kangaroo in the runtime: the drafter (the target's layers 0..ℓ-1 and the adapter, with the verify starting at
layer ℓ) and the same parts as hierarchical drafting's small model."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from specdraft.core.drafting import Drafter, DrafterCaps, IntermediateModel
from specdraft.core.errors import SpecdraftError
from specdraft.kernels.kv_compact import compact_kv
from specdraft.kernels.rms_norm import rms_norm
from specdraft.kernels.rope_cache import rope_cache
from specdraft.layers.decoder_parts import fused_norm
from specdraft.layers.draft_cache import draft_attention, draft_visible, ingest_slots, rope_tables
from specdraft.methods.kangaroo.config import KangarooConfig
from specdraft.methods.kangaroo.model import KangarooDraft


class KangarooDrafter(Drafter):
    """The runtime's Kangaroo drafter (specdraft/core/drafting.py): the target's layers 0..ℓ-1 and the adapter.

    Adapter cache [Hkv, max_len, D]: `ingest` writes the confirmed positions' keys from the target's feature
    ℓ (computed by verification); `first` and `step` write the root's and the drafted nodes' at their scratch
    slots. Shallow layers: the nodes run through the target's own layers 0..ℓ-1 with its static cache; their
    keys land at the target's scratch slots n + j. In a chain (k = 1) a step runs its one new node only: the
    earlier scratch nodes are all its ancestors, so they count as prefix for the target's tree attention
    (O(1) rows per depth). In a tree the target's attention sees the whole prefix plus the new rows by a mask,
    so `step` reruns every scratch node drafted so far (W rows, static) with the scratch visibility it recorded.

    Verification of a chain starts at layer ℓ (`verify_start_layer`; `set_verify_start_layer` lowers it, for
    a set of drafts at several ℓ that share one verify, decoding/policies/dynamic_exit.py): the shallow states of the
    scratch nodes at that layer are kept (`shallow_states` [W, H]) and their shallow KV is already at the slots
    the verify pass uses (chain
    node j is scratch slot j); `chain_verify_states` runs the one node no step read (the last draft).

    Trees verify through every layer unless the engine calls `keep_tree_states`: the verified nodes are a
    budget-selected subset of all candidates, most of which no `step` expands, and which ones is known only
    once drafting ends, so a static-shape verify can skip the shallow layers only if every candidate ran them.
    `tree_candidates` runs each depth's candidates (k*k rows, KV at target slots prefix + candidate index, each
    attending to its own root-to-node path by a mask over the cache: `run_layers_at`) and leaves the frontier's
    states for the next `step`, which then runs no shallow layer itself; `tree_verify_states` gathers the
    selected nodes' states and moves their shallow KV to the node slots (`compact_kv`, the candidate indices
    ascend), after which the engine's compaction treats every layer alike.
    """

    def __init__(self, draft: KangarooDraft, cfg: KangarooConfig, target_model):
        self.draft, self.target = draft, target_model
        self.exit_layer = draft.exit_layer
        self.verify_start_layer = draft.exit_layer
        self.feature_layers, self.d2t = [draft.exit_layer], draft.d2t
        attn = draft.self_attn
        self.heads, self.kv_heads, self.head_dim, self.theta = attn.heads, attn.kv_heads, attn.head_dim, attn.rope_theta
        self.rows = draft.head_rows(target_model.lm_head_weight)  # [Vd, H], gathered once
        layer_params = sum(p.numel() for p in target_model.layers[0].parameters())
        cost = self.exit_layer + sum(p.numel() for p in draft.self_attn.parameters()) / layer_params
        self.caps = DrafterCaps(shallow_layers=self.exit_layer, shallow_tree=True, exit_threshold=cfg.exit_threshold,
                                draft_cost_layers=cost)

    def allocate(self, max_len: int, scratch: int, device, dtype) -> None:
        self.k_cache = torch.zeros(self.kv_heads, max_len, self.head_dim, device=device, dtype=dtype)
        self.v_cache = torch.zeros_like(self.k_cache)
        self.rope = rope_tables(max_len, self.head_dim, self.theta, device, dtype)
        self.prefix_len = torch.zeros(1, dtype=torch.long, device=device)
        self.scratch_tokens = torch.zeros(scratch, dtype=torch.long, device=device)
        self.scratch_positions = torch.zeros(scratch, dtype=torch.long, device=device)
        self.scratch_mask = torch.eye(scratch, dtype=torch.bool, device=device)  # row j: what node j sees
        self.shallow_states = torch.zeros(scratch, self.rows.shape[1], device=device, dtype=dtype)  # [W, H]
        self.root_mask = torch.ones(1, 1, dtype=torch.bool, device=device)
        self.frontier_shallow: Optional[torch.Tensor] = None  # [k, H] left by `tree_candidates` for `step`
        attn = self.draft.self_attn
        qkv = [attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]
        self.qkv_weight = torch.cat(qkv).detach()  # [(h + 2 kvh) D, H]: one matmul

    def state_tensors(self):
        return [self.k_cache, self.v_cache, self.prefix_len, self.scratch_tokens, self.scratch_positions,
                self.scratch_mask, self.shallow_states]

    def _write_kv(self, shallow, positions, slots):
        """shallow [M, H] at positions [M] -> queries [Hq, M, D]; writes their keys and values at slots [M]."""
        m, kv_width = shallow.shape[0], self.kv_heads * self.head_dim
        x = fused_norm(self.draft.input_layernorm, shallow)
        q, k, v = F.linear(x, self.qkv_weight).split([self.heads * self.head_dim, kv_width, kv_width], dim=-1)
        return rope_cache(q.view(m, self.heads, -1), k.view(m, self.kv_heads, -1), v.view(m, self.kv_heads, -1),
                          *self.rope, positions, self.k_cache, self.v_cache, slots)

    def _attention_out(self, shallow, positions, slots, scratch_visible):
        """shallow [M, H] at scratch slots -> the adapter's attention output [M, H] (before its residual add); each
        row sees the confirmed prefix and the scratch slots scratch_visible [M, W] marks (`draft_attention`)."""
        q = self._write_kv(shallow, positions, slots)
        out = draft_attention(q, self.k_cache, self.v_cache, self.prefix_len, scratch_visible, root_written=True)
        return self.draft.self_attn.o_proj(out.transpose(0, 1).reshape(shallow.shape[0], -1))

    def _adapter(self, shallow, positions, slots, scratch_visible):
        """shallow [M, H] at scratch slots -> (logits [M, Vd], adapter output [M, H]) (`_attention_out`). The
        residual add and the target's final norm are one launch (`draft.logits`' bits)."""
        attn_out = self._attention_out(shallow, positions, slots, scratch_visible)
        normed, hidden = rms_norm(attn_out, self.target.norm, self.target.info.rms_norm_eps, shallow)
        return F.linear(normed, self.rows.to(normed.dtype)), hidden

    def set_verify_start_layer(self, layer: int) -> None:
        """Keep the chain's states entering `layer` (<= ℓ) for the verify instead of those entering ℓ."""
        if not 0 < layer <= self.exit_layer:
            raise SpecdraftError(f"verify start layer {layer} out of range 1..{self.exit_layer}")
        self.verify_start_layer = layer

    def _shallow_chain(self, tokens, positions, first_slot, end_layer: Optional[int] = None):
        """A chain segment tokens [m] at positions [m] after everything before target slot first_slot [1]
        (confirmed prefix and earlier chain nodes) through layers 0..end_layer-1 (default ℓ) -> (states entering
        end_layer [m, H], states entering verify_start_layer [m, H]); writes its shallow KV."""
        m, end_layer = tokens.shape[0], self.exit_layer if end_layer is None else end_layer
        causal = self.root_mask if m == 1 else torch.ones(m, m, dtype=torch.bool, device=tokens.device).tril()
        shallow, captured = self.target.run_layers(self.target.embed(tokens), positions, first_slot, causal, 0,
                                                   end_layer, capture=[self.verify_start_layer])
        return shallow, captured[self.verify_start_layer]

    def ingest(self, features, next_tokens, start, count) -> None:
        shallow = features[self.exit_layer].to(self.k_cache.dtype)  # [M, H]
        columns = ingest_slots(start, shallow.shape[0], shallow.device)  # [M]
        self._write_kv(shallow, columns, columns)
        torch.add(start, count, out=self.prefix_len)

    def first(self, root_token, position):
        self.frontier_shallow = None  # a new cycle: nothing left for `step` until `tree_candidates` runs
        self.scratch_tokens[:1] = root_token
        self.scratch_positions[:1] = position
        shallow, kept = self._shallow_chain(root_token, position, self.prefix_len)  # [1, H] each
        self.shallow_states[:1] = kept
        return self._adapter(shallow, position, self.prefix_len, self.root_mask)  # the root sees itself

    def step(self, depth, hidden, tokens, positions, scratch_slots, scratch_visible):
        frontier_shallow, self.frontier_shallow = self.frontier_shallow, None
        if frontier_shallow is not None:  # a tree whose candidates ran the shallow layers (`tree_candidates`)
            shallow = frontier_shallow  # [k, H]
        elif tokens.shape[0] == 1:  # a chain: scratch slots 0..depth-1 are all ancestors, i.e. prefix
            shallow, kept = self._shallow_chain(tokens, positions, self.prefix_len + scratch_slots)  # [1, H] each
            self.shallow_states.index_copy_(0, scratch_slots, kept)
        else:
            shallow = self._shallow_tree(tokens, positions, scratch_slots, scratch_visible)  # [k, H]
        return self._adapter(shallow, positions, self.prefix_len + scratch_slots, scratch_visible)

    def _shallow_tree(self, tokens, positions, scratch_slots, scratch_visible):
        """Every scratch node so far through layers 0..ℓ-1 (W rows, tree mask) -> the k new nodes' [k, H]."""
        self.scratch_tokens.index_copy_(0, scratch_slots, tokens)
        self.scratch_positions.index_copy_(0, scratch_slots, positions)
        self.scratch_mask.index_copy_(0, scratch_slots, scratch_visible)
        shallow, _ = self.target.run_layers(self.target.embed(self.scratch_tokens), self.scratch_positions,
                                            self.prefix_len, self.scratch_mask, 0, self.exit_layer)  # [W, H]
        return shallow[scratch_slots]

    def keep_tree_states(self, num_candidates: int) -> None:
        """Room for a state entering verify_start_layer per tree candidate (drafter.py; the root's from `first`)."""
        rows = max(num_candidates, self.shallow_states.shape[0])
        self.shallow_states = self.shallow_states.new_zeros(rows, self.shallow_states.shape[1])  # [C, H]

    def tree_candidates(self, tokens, positions, first: int, paths, frontier) -> None:
        """tokens, positions [c] of candidates first..first+c-1, paths [c, C], frontier [k] (drafter.py) through
        layers 0..ℓ-1 at target slots prefix + candidate index; keeps the frontier's output for `step`."""
        count = tokens.shape[0]
        slots = self.prefix_len + first + torch.arange(count, device=tokens.device)  # [c]
        slot_mask = draft_visible(self.prefix_len, self.target.max_len, paths, root_written=True)  # [c, S]
        shallow, captured = self.target.run_layers_at(self.target.embed(tokens), positions, slots, slot_mask,
                                                      self.exit_layer, capture=[self.verify_start_layer])
        self.shallow_states[first:first + count] = captured[self.verify_start_layer]  # [c, H]
        self.frontier_shallow = shallow[frontier]  # [k, H] entering ℓ

    def tree_verify_states(self, candidate_ids):
        """candidate_ids [N] ascending -> [N, H] entering verify_start_layer; their shallow KV moves from target
        slots prefix + candidate index to prefix + node index (drafter.py)."""
        layers, count = self.verify_start_layer, torch.full_like(self.prefix_len, candidate_ids.shape[0])
        compact_kv(self.target.k_cache[:layers], self.target.v_cache[:layers], self.prefix_len + candidate_ids,
                   self.prefix_len, count)
        return self.shallow_states[candidate_ids]

    def chain_verify_states(self, tokens, positions, computed: int):
        """tokens, positions [n] of the chain -> [n, H] entering verify_start_layer (drafter.py); runs nodes
        computed..n-1 through the layers below it."""
        n = tokens.shape[0]
        if computed >= n:
            return self.shallow_states[:n]
        tail, _ = self._shallow_chain(tokens[computed:], positions[computed:], self.prefix_len + computed,
                                      self.verify_start_layer)
        return torch.cat([self.shallow_states[:computed], tail])


def kangaroo_runtime(draft: KangarooDraft, cfg: KangarooConfig, target_model) -> KangarooDrafter:
    return KangarooDrafter(draft, cfg, target_model)


class KangarooIntermediate(IntermediateModel):
    """The target's layers 0..ℓ-1 and the adapter as hierarchical drafting's small model (decoding/hierarchy.py).
    A tree's nodes run through the shallow layers with the target's own cache (their KV lands at the target's tree
    slots, which the target's verify of the kept sequence rewrites before anything reads them) and through the
    adapter (its own cache, the drafter's: confirmed positions from the target's feature ℓ), then the target's
    final norm and whole LM head."""

    def __init__(self, draft: KangarooDraft, cfg: KangarooConfig, target_model):
        self.adapter, self.target = KangarooDrafter(draft, cfg, target_model), target_model
        self.feature_layers = [draft.exit_layer]

    def allocate(self, max_len, device, dtype) -> None:
        self.adapter.allocate(max_len, 1, device, dtype)

    def state_tensors(self):
        return self.adapter.state_tensors()

    def prefill(self, prompt_ids, count, features) -> None:
        self.adapter.ingest(features, prompt_ids, torch.zeros_like(count), count)

    def logits(self, tokens, positions, prefix_len, tree_mask):
        shallow, _ = self.target.run_layers(self.target.embed(tokens), positions, prefix_len, tree_mask, 0,
                                            self.adapter.exit_layer)  # [N, H]
        slots = prefix_len + torch.arange(tokens.shape[0], device=tokens.device)  # [N]
        return self.target.logits(shallow + self.adapter._attention_out(shallow, positions, slots, tree_mask))

    def commit(self, features, tree_nodes, last_token, start, count) -> None:
        self.adapter.ingest(features, tree_nodes, start, count)


def kangaroo_intermediate(draft: KangarooDraft, cfg: KangarooConfig, target_model) -> KangarooIntermediate:
    return KangarooIntermediate(draft, cfg, target_model)
