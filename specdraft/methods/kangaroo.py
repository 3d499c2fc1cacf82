"""Kangaroo: self-speculative decoding with double early exiting (Liu et al., "Kangaroo: Lossless
Self-Speculative Decoding via Double Early Exiting", arXiv:2404.18911).

The draft is the target itself, cut after its first ℓ decoder layers, plus a small trained adapter: one
attention block (the target's head geometry) between a norm and a residual, no MLP. It reads the target's
hidden state at index ℓ (specdraft's convention: the input of decoder layer ℓ, i.e. after layers 0..ℓ-1) and
drafts through the target's own final norm and LM head, frozen and shared. Drafting stops early when the
adapter's top-1 probability falls below η (`exit_threshold`; the second early exit, the runtime's chain cycles).

Exit layer ℓ (`exit_layer`): the paper exits Vicuna-7B after 2 of its 32 layers; its ablation over depth shows
that deeper exits buy acceptance at the price of a costlier draft step, with the best speed-up that shallow.
The default keeps that share of the depth, ℓ = max(1, round(L / 16)) (SmolLM2-135M, L=30: 2; Llama-3.1-8B: 2).
On SmolLM2 the sweep agrees: ℓ = 1, 2, 3, 4 gave 1.43, 1.46, 1.33 and 1.27x plain decoding on a (3, 4, 12) tree
(docs/benchmarks.md); sweep it on other targets (`python tools/bench/runtime.py kangaroo EXPORT...`).

Shared target parts: the LM head and final norm are the target's, never copies: in training they come from the
frozen target the trainer holds (`bind_target`), in the evaluator from the target it loads (`bind_target`), in
the runtime from its compact target (`lm_head_weight`, `final_norm`). Exports hold only the adapter and the
draft vocabulary, and every consumer loads the target anyway to verify. The draft vocabulary (FR-Spec, as for
EAGLE-3) picks rows of the shared LM head: `draft_vocab_size: null` keeps the whole vocabulary (the paper);
a smaller one makes each draft step cheaper (the LM head is most of a small target's per-token cost).

Training: soft cross-entropy between the adapter's distribution at column t (it has read x_0..x_t through the
shallow layers) and the target's final distribution at t, i.e. over the next token x[t+1]. Training-time test
(`ttt_steps`) needs no unroll here: the adapter reads the target's shallow states of the tokens, never its own
outputs, so with teacher-forced tokens (as EAGLE-3's TTT) step j at column t computes exactly what step 0
computes at column t + j, and along every chain the target accepts, the drafted tokens are those real tokens.
Teacher forcing is thus exact for Kangaroo; unrolling on self-drafted tokens would need the shallow layers run
again per step on tokens that, once wrong, the verifier rejects together with all that follows, so it would
train nothing a greedy chain uses. `ttt_steps` sets how far acc@k and tau_sim simulate the chain (from the
step-0 predictions shifted by j); the loss is step 0's, the paper's objective (more steps would only rescale it).

Inference: confirmed positions' adapter keys come from the target's own feature ℓ (computed by verification);
each drafted token goes through the target's layers 0..ℓ-1 (with their KV cache) and then the adapter. In the
runtime (`KangarooDrafter`) a chain's verify starts at layer ℓ over those shallow states (a tree's too, when the
engine asks: its drafter then runs every tree candidate through the shallow layers), and the engine's confidence
exit (specdraft/decoding/cycles/chain.py) defaults to `exit_threshold`.

Hierarchical drafting (`KangarooIntermediate`, runtime.intermediate = a Kangaroo export): the shallow layers and
the adapter, scored by the target's whole LM head, check another draft's tree before the target verifies the
sequence they keep (specdraft/decoding/hierarchy.py).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from specdraft.core.errors import SpecdraftError
from specdraft.kernels.kv_compact import compact_kv
from specdraft.kernels.rms_norm import rms_norm
from specdraft.kernels.rope_cache import rope_cache
from specdraft.kernels.soft_ce import soft_cross_entropy
from specdraft.layers import RMSNorm, apply_rope, repeat_kv, rope_cos_sin
from specdraft.layers.decoder_parts import fused_norm
from specdraft.layers.zero import init_linear_normal_
from specdraft.core.drafting import Drafter, DrafterCaps, IntermediateModel
from specdraft.core.types import DraftBatch, DraftContext, LossOutput, TargetInfo
from specdraft.layers.draft_cache import draft_attention, draft_visible, ingest_slots, rope_tables
from specdraft.methods.base import ExportFormat, MethodSpec
from specdraft.methods.shared import DraftVocab, shift_left

KV = Tuple[torch.Tensor, torch.Tensor]  # keys, values: [B, kv_heads, T, D]


@dataclass
class KangarooConfig:
    exit_layer: Optional[int] = None
    """ℓ: the adapter reads hidden state ℓ, the input of target layer ℓ; None: max(1, round(L / 16))."""
    ttt_steps: int = 7
    """Chain positions simulated per column for acc@k and tau_sim (teacher forcing is exact: module docstring)."""
    draft_vocab_size: Optional[int] = None
    """Rows of the target's LM head the draft scores (most frequent answer tokens); None: the whole vocabulary."""
    exit_threshold: float = 0.6
    """η: the runtime stops drafting when the adapter's top-1 probability falls below it (0: never early)."""
    init_std: float = 0.02
    """Standard deviation of the initial adapter projections."""

    def __post_init__(self):
        if self.ttt_steps < 1:
            raise SpecdraftError(f"method.ttt_steps must be >= 1, got {self.ttt_steps}")
        if not 0.0 <= self.exit_threshold < 1.0:
            raise SpecdraftError(f"method.exit_threshold must be in [0, 1), got {self.exit_threshold}")


def kangaroo_exit_layer(cfg: KangarooConfig, target: TargetInfo) -> int:
    layer = cfg.exit_layer if cfg.exit_layer is not None else max(1, round(target.num_layers / 16))
    if not 0 < layer < target.num_layers:
        raise SpecdraftError(f"method.exit_layer {layer} out of range; valid: 1..{target.num_layers - 1}")
    return layer


def kangaroo_feature_layers(cfg: KangarooConfig, target: TargetInfo) -> List[int]:
    return [kangaroo_exit_layer(cfg, target)]


class AdapterAttention(nn.Module):
    """Causal GQA attention with the target's head geometry and rotary positions, over an optional KV cache."""

    def __init__(self, target: TargetInfo):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = target.num_heads, target.num_kv_heads, target.head_dim
        self.rope_theta = target.rope_theta
        hidden = target.hidden_size
        self.q_proj = nn.Linear(hidden, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, hidden, bias=False)

    def _split(self, x: torch.Tensor, heads: int) -> torch.Tensor:  # [B, T, heads*D] -> [B, heads, T, D]
        return x.view(*x.shape[:2], heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache: Optional[KV]) -> Tuple[torch.Tensor, KV]:
        """x [B, T, H] at positions [T], after the cached positions -> [B, T, H] and the KV of cache + these T."""
        cos, sin = rope_cos_sin(positions, self.head_dim, self.rope_theta, x.dtype)
        queries = apply_rope(self._split(self.q_proj(x), self.heads), cos, sin)  # [B, h, T, D]
        keys = apply_rope(self._split(self.k_proj(x), self.kv_heads), cos, sin)  # [B, kvh, T, D]
        values = self._split(self.v_proj(x), self.kv_heads)
        if cache is not None:
            keys, values = torch.cat([cache[0], keys], dim=2), torch.cat([cache[1], values], dim=2)
        past = keys.shape[2] - x.shape[1]
        query_pos = torch.arange(x.shape[1], device=x.device) + past
        visible = torch.arange(keys.shape[2], device=x.device)[None, :] <= query_pos[:, None]  # [T, past + T]
        groups = self.heads // self.kv_heads
        out = F.scaled_dot_product_attention(queries, repeat_kv(keys, groups), repeat_kv(values, groups),
                                             attn_mask=visible)  # [B, h, T, D]
        return self.o_proj(out.transpose(1, 2).reshape(*x.shape[:2], -1)), (keys, values)


class KangarooDraft(DraftVocab, nn.Module):
    """The adapter: shallow [B, T, H] -> shallow + attention(norm(shallow)), scored by the target's head."""

    def __init__(self, cfg: KangarooConfig, ctx: DraftContext):
        super().__init__()
        target = ctx.target
        self.exit_layer = kangaroo_exit_layer(cfg, target)
        self.feature_layers = [self.exit_layer]
        self.input_layernorm = RMSNorm(target.hidden_size, target.rms_norm_eps)
        self.self_attn = AdapterAttention(target)
        init_linear_normal_(self.self_attn, cfg.init_std)  # gathers ZeRO-3 partitions: zero.Init split them
        vocab = min(cfg.draft_vocab_size or target.vocab_size, target.vocab_size)
        self.init_draft_vocab(ctx.token_counts, vocab, target.vocab_size)
        object.__setattr__(self, "target_model", None)  # bound by `bind_target`; never a submodule

    def forward(self, shallow: torch.Tensor, positions: torch.Tensor, cache: Optional[KV] = None):
        """shallow [B, T, H] target states at ℓ, positions [T] -> adapter output [B, T, H] (pre-norm), KV."""
        attn_out, kv = self.self_attn(self.input_layernorm(shallow), positions, cache)
        return shallow + attn_out, kv

    def head_rows(self, lm_head_weight: torch.Tensor) -> torch.Tensor:
        """The target's LM head [V, H] -> the draft vocabulary's rows [Vd, H] (the weight itself if Vd = V)."""
        if self.d2t.shape[0] == lm_head_weight.shape[0]:
            return lm_head_weight
        return lm_head_weight[self.draft_ids().to(lm_head_weight.device)]

    def logits(self, hidden: torch.Tensor, final_norm, head_rows: torch.Tensor) -> torch.Tensor:
        """hidden [.., H] -> [.., Vd] through the target's final norm and LM head rows [Vd, H]."""
        normed = final_norm(hidden)
        return F.linear(normed, head_rows.to(normed.dtype))

    def target_logits_fn(self):
        """hidden [.., H] -> [.., Vd] through the bound Hugging Face target's final norm and LM head."""
        model = self.target_model
        if model is None:
            raise SpecdraftError("the Kangaroo adapter has no target bound (spec.bind_target(draft, target_model))")
        head = self.head_rows(model.get_output_embeddings().weight)
        return lambda hidden: self.logits(hidden, model.get_decoder().norm, head)


def kangaroo_bind(draft: KangarooDraft, target_model: Optional[nn.Module]) -> None:
    if target_model is None:  # offline or hybrid features: the trainer holds no target model
        raise SpecdraftError("Kangaroo trains with data.features=online: its draft runs the target's final norm "
                             "and LM head, which stored features do not keep")
    head_and_norm = [target_model.get_output_embeddings().weight, target_model.get_decoder().norm.weight]
    if any(hasattr(weight, "ds_id") for weight in head_and_norm):  # partitioned: empty outside the target's forward
        raise SpecdraftError("Kangaroo's draft runs the target's final norm and LM head outside the target's forward, "
                             "which a ZeRO-3 partitioned target does not allow: set train.shard_target=false")
    object.__setattr__(draft, "target_model", target_model)


def chain_metrics(correct: torch.Tensor, mask: torch.Tensor, steps: int) -> Dict[str, torch.Tensor]:
    """correct, mask [B, T] of step 0 -> acc@1..steps and tau_sim; step j at column t is step 0 at t + j."""
    metrics, chain_alive, chain_len = {}, None, torch.zeros_like(mask)
    for step in range(steps):
        step_correct, step_mask = shift_left(correct, step), shift_left(mask, step)
        metrics[f"acc@{step + 1}"] = (step_correct.float() * step_mask).sum() / step_mask.sum().clamp(min=1)
        chain_alive = step_correct if chain_alive is None else chain_alive & step_correct
        chain_len = chain_len + chain_alive.float()
    metrics["tau_sim"] = 1.0 + (chain_len * mask).sum() / mask.sum().clamp(min=1)
    return metrics


def kangaroo_loss(draft: KangarooDraft, batch: DraftBatch, cfg: KangarooConfig) -> LossOutput:
    """Soft cross-entropy against the target's next-token distribution over the draft vocabulary; positions
    whose target argmax lies outside it carry no loss (FR-Spec) and count as rejected in the metrics."""
    if batch.document_ids is not None:
        raise SpecdraftError("Kangaroo trains on unpacked rows: leave data.pack_length unset")
    feats = batch.features
    shallow = feats.hidden_states[draft.exit_layer]  # [B, T, H]
    positions = torch.arange(shallow.shape[1], device=shallow.device)
    hidden, _ = draft(shallow.to(draft.input_layernorm.weight.dtype), positions)
    draft_logits = draft.target_logits_fn()(hidden)  # [B, T, Vd]
    target_logits = feats.logits_for(draft.draft_ids())  # [B, T, Vd]: column t scores x[t+1]
    in_vocab = feats.argmax_in(draft.t2d)  # [B, T]
    mask = shift_left((batch.loss_mask * batch.attention_mask).float(), 1)  # x[t+1] is an answer token
    loss_mask = mask * in_vocab
    loss = soft_cross_entropy(draft_logits.flatten(0, 1), target_logits.flatten(0, 1), loss_mask.flatten())
    loss = loss / loss_mask.sum().clamp(min=1)
    with torch.no_grad():
        correct = (draft_logits.argmax(-1) == target_logits.argmax(-1)) & in_vocab & (mask > 0)
        metrics = chain_metrics(correct, mask, cfg.ttt_steps)
    metrics["loss"] = loss.detach()
    return LossOutput(loss=loss, metrics=metrics)


def kangaroo_to_hf(draft: KangarooDraft, cfg: KangarooConfig, target: TargetInfo, provenance: Dict[str, Any]):
    """The adapter and draft vocabulary only: the LM head and final norm stay the target's (module docstring)."""
    attn = draft.self_attn
    config = {
        "architectures": ["KangarooAdapter"],
        "model_type": target.model_type,
        "hidden_size": target.hidden_size,
        "num_attention_heads": attn.heads,
        "num_key_value_heads": attn.kv_heads,
        "head_dim": attn.head_dim,
        "rms_norm_eps": target.rms_norm_eps,
        "rope_theta": target.rope_theta,
        "rope_scaling": target.rope_scaling,
        "max_position_embeddings": target.max_position_embeddings,
        "vocab_size": target.vocab_size,
        "draft_vocab_size": draft.d2t.shape[0],
        "kangaroo_config": {
            "exit_layer": draft.exit_layer,
            "reads": "hidden state exit_layer: the input of target decoder layer exit_layer",
            "lm_head": "the target's, not in this file", "final_norm": "the target's, not in this file",
            "exit_threshold": cfg.exit_threshold,
        },
        "torch_dtype": "bfloat16",
        "specdraft": {"method": "kangaroo", "method_config": asdict(cfg), **provenance},
    }
    return config, {name: tensor.detach() for name, tensor in draft.state_dict().items()}


def kangaroo_hf_keys(draft: KangarooDraft, target: TargetInfo) -> List[str]:
    return ["input_layernorm.weight", "d2t", "t2d", *[f"self_attn.{p}_proj.weight" for p in "qkvo"]]


def kangaroo_from_export(config: Dict[str, Any], tensors: Dict[str, torch.Tensor], ctx: DraftContext):
    saved = (config.get("specdraft") or {}).get("method_config")
    if not saved or "exit_layer" not in saved:
        raise SpecdraftError("this export has no Kangaroo method_config in config.json['specdraft']; "
                             "export it with specdraft export --format hf")
    cfg = KangarooConfig(**saved)
    draft = KangarooDraft(cfg, ctx)
    draft.load_state_dict(tensors, strict=True)
    return cfg, draft


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


SPEC = MethodSpec(
    name="kangaroo",
    config=KangarooConfig,
    build=KangarooDraft,
    loss=kangaroo_loss,
    feature_layers=kangaroo_feature_layers,
    exports={"hf": ExportFormat(write=kangaroo_to_hf, required_keys=kangaroo_hf_keys)},
    from_export=kangaroo_from_export,
    bind_target=kangaroo_bind,
    runtime=kangaroo_runtime,
    intermediate=kangaroo_intermediate,
    reads_embeddings=False,
)
