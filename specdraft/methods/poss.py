"""PosS: position specialists on the EAGLE-3 head (Huang et al., "Position Specialist Generates Better Draft
for Speculative Decoding", arXiv:2506.03566).

EAGLE-3's head drafts every position with one decoder layer, although the features it reads drift further from
the target's with every drafted token. PosS-n keeps EAGLE-3's shared parts (the `fc` fusion of low/mid/high
target features, the draft vocabulary d2t/t2d, the final norm and LM head) and gives each band of n draft
positions its own decoder layer: specialist j drafts positions [j·n, (j+1)·n) of a drafting round, and
positions past the last band go to the last specialist. In training-time test (see eagle3.py), TTT step i
(which drafts position i, i.e. the token at depth i + 1) goes through specialist min(⌊i/n⌋, S - 1).

Keys each specialist attends to (our choice; the paper leaves it to the implementation):
  - the confirmed prefix: every specialist has its own step-0 keys, projected by its own norms and k/v
    projections from the same inputs as EAGLE-3's step 0 (fused target features at column t, embedding of
    token t+1). Specialist 0 writes them while it runs step 0; the others only project keys and values
    (`specialist_prefix_kv`, no attention or MLP), each once per sequence;
  - the drafted tokens above the prefix (TTT steps 1..i-1 at the same column): one shared chain of keys,
    each written by the specialist that drafted that depth. A specialist therefore reads its predecessors'
    keys; training-time test trains exactly this.
At inference a drafter thus keeps S prefix caches (one per specialist, filled in one pass when confirmed
tokens arrive) and one scratch region for drafted tokens, so every depth is still one batched call through
one specialist. Initialised from an EAGLE-3 checkpoint (`init_from`), every specialist is a copy of EAGLE-3's
layer and PosS computes exactly what that EAGLE-3 head computes (tests/test_poss.py checks it). Packed rows,
flex attention and activation checkpointing work as for EAGLE-3 (eagle3.ttt_unroll).

Export (`--format hf`): EAGLE-3's config keys plus `poss_config`, which says which specialist serves which draft
depth, and weights `fc`, `norm`, `lm_head`, `d2t`, `t2d`, `specialists.{j}.*` (each laid out as EAGLE-3's
`midlayer.*`). SGLang and vLLM do not load it (its architecture `PossEagle3Draft` is ours); specdraft's
evaluator and runtime do.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from specdraft.core.errors import SpecdraftError
from specdraft.layers import apply_rope, rope_cos_sin
from specdraft.layers.decoder_parts import RuntimeWeights, fused_norm, layer_query, layer_tail
from specdraft.layers.zero import init_linear_normal_
from specdraft.core.drafting import Drafter
from specdraft.core.types import DraftContext, TargetInfo
from specdraft.layers.draft_cache import draft_attention, ingest_attention, ingest_slots, rope_tables
from specdraft.methods.base import ExportFormat, MethodSpec
from specdraft.methods.eagle3 import (
    KV,
    Eagle3Config,
    Eagle3DecoderLayer,
    Eagle3Draft,
    check_source,
    eagle3_feature_layers,
    eagle3_hf_config,
    eagle3_hf_keys,
    eagle3_loss,
    eagle3_warm_start,
    load_initial_state,
    ttt_inputs,
)


@dataclass
class PossConfig(Eagle3Config):
    num_specialists: int = 3
    """Decoder layers, one per band of draft positions (3 with 2 positions each covers a chain of 6)."""
    positions_per_specialist: int = 2
    """n of PosS-n: specialist j drafts positions [j·n, (j+1)·n); later positions use the last specialist."""
    init_from: Optional[str] = None
    """An EAGLE-3 run directory or `hf` export whose fc, vocabulary, norm, LM head and (copied into every
    specialist) decoder layer start the training; None starts from random weights."""

    def __post_init__(self):
        super().__post_init__()
        if self.num_specialists < 1 or self.positions_per_specialist < 1:
            raise SpecdraftError(f"method.num_specialists and method.positions_per_specialist must be >= 1, got "
                                 f"{self.num_specialists} and {self.positions_per_specialist}")
        trained = math.ceil(self.ttt_steps / self.positions_per_specialist)
        if self.num_specialists > trained:
            raise SpecdraftError(f"method.num_specialists={self.num_specialists} leaves specialists untrained: "
                                 f"{self.ttt_steps} TTT steps of {self.positions_per_specialist} positions each "
                                 f"reach at most {trained}")


class PossDraft(Eagle3Draft):
    """EAGLE-3's head with `specialists` (one Eagle3DecoderLayer each) in place of its single `midlayer`."""

    def __init__(self, cfg: PossConfig, ctx: DraftContext):
        super().__init__(cfg, ctx)
        first = self._modules.pop("midlayer")  # EAGLE-3's layer becomes specialist 0
        width = first.mlp.gate_proj.out_features
        others = [Eagle3DecoderLayer(ctx.target, width) for _ in range(cfg.num_specialists - 1)]
        init_linear_normal_(nn.ModuleList(others), cfg.init_std)  # gathers ZeRO-3 partitions (zero.Init)
        self.specialists = nn.ModuleList([first, *others])
        self.positions_per_specialist = cfg.positions_per_specialist

    @property
    def midlayer(self) -> Eagle3DecoderLayer:
        """Specialist 0, under the name EAGLE-3's helpers (the export config) use."""
        return self.specialists[0]

    def specialist_for(self, step: int) -> int:
        """The specialist that runs TTT step `step` (which drafts the token at depth step + 1)."""
        return min(step // self.positions_per_specialist, len(self.specialists) - 1)

    def step(self, hidden, embeds, positions, query_cols, cache, mask=None, specialist: int = 0, weights_for=None):
        """One draft step through `specialist`: hidden, embeds [B, Tq, H] -> new hidden [B, Tq, H], this KV."""
        return self.specialists[specialist](hidden, embeds, positions=positions, query_cols=query_cols, cache=cache,
                                            mask=mask, weights_for=weights_for)  # keywords: Eagle3Draft.step


def specialist_prefix_kv(layer: Eagle3DecoderLayer, fused: torch.Tensor, embeds: torch.Tensor,
                         positions: torch.Tensor) -> KV:
    """The step-0 keys and values `layer` would write, without its attention or MLP.

    fused, embeds [B, T, H] (fused features at t, embedding of token t+1); positions [T] or [B, T] -> keys and
    values [B, kvh, T, D].
    Mirrors Eagle3DecoderLayer/Eagle3Attention up to the projections (tests compare the two)."""
    attn = layer.self_attn
    attn_in = torch.cat([layer.input_layernorm(embeds), layer.hidden_norm(fused)], dim=-1)  # [B, T, 2H]
    cos, sin = rope_cos_sin(positions, attn.head_dim, attn.rope_theta, attn_in.dtype)
    batch, length = attn_in.shape[:2]
    keys = attn.k_proj(attn_in).view(batch, length, attn.kv_heads, attn.head_dim).transpose(1, 2)
    values = attn.v_proj(attn_in).view(batch, length, attn.kv_heads, attn.head_dim).transpose(1, 2)
    return apply_rope(keys, cos, sin), values


class PrefixKeys:
    """Each specialist's step-0 keys over one prefix, projected the first time that specialist is needed."""

    def __init__(self, draft: PossDraft, fused: torch.Tensor, embeds: torch.Tensor, positions: torch.Tensor):
        self.draft, self.fused, self.embeds, self.positions = draft, fused, embeds, positions
        self.by_specialist: Dict[int, KV] = {}

    def __getitem__(self, specialist: int) -> KV:
        if specialist not in self.by_specialist:
            layer = self.draft.specialists[specialist]
            self.by_specialist[specialist] = specialist_prefix_kv(layer, self.fused, self.embeds, self.positions)
        return self.by_specialist[specialist]


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


def specialist_by_depth(draft: PossDraft, depths: int) -> List[int]:
    """[specialist serving draft depth d] for d = 1..depths (depth d is TTT step d - 1)."""
    return [draft.specialist_for(depth - 1) for depth in range(1, depths + 1)]


def poss_to_hf(draft: PossDraft, cfg: PossConfig, target: TargetInfo, provenance: Dict[str, Any]):
    config = eagle3_hf_config(draft, cfg, target, provenance)
    config["architectures"] = ["PossEagle3Draft"]  # no serving engine claims it: ours alone loads it
    config["num_hidden_layers"] = len(draft.specialists)
    config["specdraft"]["method"] = "poss"
    config["poss_config"] = {
        "num_specialists": len(draft.specialists),
        "positions_per_specialist": draft.positions_per_specialist,
        "specialist_by_depth": specialist_by_depth(draft, cfg.ttt_steps),
        "deeper": "the last specialist serves every depth past this list",
        "layer_weights": "specialists.{j}.* laid out as EAGLE-3's midlayer.*",
    }
    tensors = {name: tensor.detach() for name, tensor in draft.state_dict().items()}
    return config, tensors


def poss_hf_keys(draft: PossDraft, target: TargetInfo) -> List[str]:
    shared = [k for k in eagle3_hf_keys(draft, target) if not k.startswith("midlayer.")]
    layer_keys = [k[len("midlayer."):] for k in eagle3_hf_keys(draft, target) if k.startswith("midlayer.")]
    return shared + [f"specialists.{j}.{k}" for j in range(len(draft.specialists)) for k in layer_keys]


def poss_from_export(config: Dict[str, Any], tensors: Dict[str, torch.Tensor], ctx: DraftContext):
    saved = (config.get("specdraft") or {}).get("method_config")
    if not saved or "num_specialists" not in saved:
        raise SpecdraftError("this export has no PosS method_config in config.json['specdraft']; "
                             "export it with specdraft export --format hf")
    cfg = PossConfig(**saved)
    draft = PossDraft(cfg, ctx)
    draft.load_state_dict(tensors, strict=True)
    return cfg, draft


def poss_initialize(draft: PossDraft, cfg: PossConfig, ctx: DraftContext) -> None:
    """`method.init_from` (ctx.warm_start): shared parts and every specialist from an EAGLE-3 run or export."""
    source = check_source(ctx.warm_start, cfg, draft.feature_layers, "PosS head")
    state = {}
    for name, tensor in source.state_dict().items():
        if name.startswith("midlayer."):
            state.update({f"specialists.{j}.{name[len('midlayer.'):]}": tensor for j in range(len(draft.specialists))})
        else:
            state[name] = tensor
    load_initial_state(draft, state, cfg, "PosS head")


class PossDrafter(Drafter):
    """The runtime's PosS drafter (specdraft/core/drafting.py), EAGLE-3's (eagle3.Eagle3Drafter) with one
    KV cache per specialist: [S, Hkv, max_len, D].

    Confirmed slots: each specialist's own step-0 keys (`ingest` projects them for every specialist, and runs
    specialist 0 whole for the depth-1 distribution). Scratch slots: the drafted chain, shared: the keys a
    depth's specialist writes go into every specialist's cache, so the next specialist attends to them as in
    training. A depth is one batched call through one specialist (`step`'s depth is a Python int).
    """

    def __init__(self, draft: PossDraft, target_model):
        self.draft, self.embed_weight = draft, target_model.embed_tokens.weight  # [V, H]
        self.feature_layers, self.d2t = list(draft.feature_layers), draft.d2t
        attn = draft.specialists[0].self_attn
        self.kv_heads, self.head_dim, self.theta = attn.kv_heads, attn.head_dim, attn.rope_theta

    def allocate(self, max_len: int, scratch: int, device, dtype) -> None:
        shape = (len(self.draft.specialists), self.kv_heads, max_len, self.head_dim)
        self.k_cache = torch.zeros(shape, device=device, dtype=dtype)
        self.v_cache = torch.zeros_like(self.k_cache)
        self.rope = rope_tables(max_len, self.head_dim, self.theta, device, self.draft.fc.weight.dtype)
        self.prefix_len = torch.zeros(1, dtype=torch.long, device=device)
        self.last_hidden = torch.zeros(1, self.draft.fc.out_features, device=device, dtype=dtype)
        self.weights = [RuntimeWeights.of(layer) for layer in self.draft.specialists]

    def state_tensors(self):
        return [self.k_cache, self.v_cache, self.prefix_len, self.last_hidden]

    def _project(self, specialist: int, hidden, tokens, rope_positions, k_cache, v_cache, slots, position_offset=0,
                 slot_base=None):
        """hidden [M, H]; tokens, rope_positions, slots [M] -> q [Hq, M, D] of `specialist` (at rope_positions +
        position_offset); writes its keys and values at the slots (+ slot_base [1]) of k_cache, v_cache ([Hkv, S,
        D], or [C, Hkv, S, D]: into every specialist's)."""
        return layer_query(self.draft.specialists[specialist], self.weights[specialist], hidden, tokens,
                           self.embed_weight, self.rope, rope_positions, k_cache, v_cache, slots, position_offset,
                           slot_base)

    def _tail(self, specialist: int, hidden, attended):
        """hidden [M, H], attended [Hq, M, D] (the specialist's attention output) -> (the head's final norm of the
        specialist's output, the output), each [M, H]."""
        weights = self.weights[specialist]
        attn_out = F.linear(attended.transpose(0, 1).reshape(hidden.shape[0], -1), weights.o)  # [M, H]
        return layer_tail(self.draft.specialists[specialist], weights, self.draft.norm, hidden, attn_out)

    @torch.no_grad()  # inference only: the last row goes through out=, which autograd refuses
    def ingest(self, features, next_tokens, start, count) -> None:
        m, device = next_tokens.shape[0], next_tokens.device
        aux = torch.cat([features[i] for i in self.feature_layers], dim=-1)  # [M, 3H]
        fused = self.draft.fc(aux.to(self.draft.fc.weight.dtype))  # [M, H]
        columns = ingest_slots(start, m, device)  # [M]
        for specialist in reversed(range(len(self.draft.specialists))):  # ends with specialist 0's queries
            q = self._project(specialist, fused, next_tokens, columns, self.k_cache[specialist],
                              self.v_cache[specialist], columns)
        _, hidden = self._tail(0, fused, ingest_attention(q, self.k_cache[0], self.v_cache[0], start))
        torch.index_select(hidden, 0, count - 1, out=self.last_hidden)  # [1, H]
        torch.add(start, count, out=self.prefix_len)

    def first(self, root_token, position):
        return self.draft.lm_head(fused_norm(self.draft.norm, self.last_hidden)), self.last_hidden

    def step(self, depth, hidden, tokens, positions, scratch_slots, scratch_visible):
        specialist = self.draft.specialist_for(depth)  # TTT step `depth` drafts depth + 1
        q = self._project(specialist, hidden, tokens, positions, self.k_cache, self.v_cache, scratch_slots,
                          position_offset=-1, slot_base=self.prefix_len)  # every specialist sees the chain
        attended = draft_attention(q, self.k_cache[specialist], self.v_cache[specialist], self.prefix_len,
                                   scratch_visible, root_written=False)
        normed, out = self._tail(specialist, hidden, attended)
        return self.draft.lm_head(normed), out


def poss_runtime(draft: PossDraft, cfg: PossConfig, target_model) -> PossDrafter:
    return PossDrafter(draft, target_model)


SPEC = MethodSpec(
    name="poss",
    config=PossConfig,
    build=PossDraft,
    loss=poss_loss,
    feature_layers=eagle3_feature_layers,
    exports={"hf": ExportFormat(write=poss_to_hf, required_keys=poss_hf_keys)},
    from_export=poss_from_export,
    warm_start=eagle3_warm_start,
    initialize=poss_initialize,
    runtime=poss_runtime,
)
