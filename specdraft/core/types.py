"""The types every layer shares: the frozen target's geometry (`TargetInfo`) and outputs (`TargetFeatures`), one
training batch (`DraftBatch`), what a draft is built from (`DraftContext`) and what a loss returns (`LossOutput`).
They live below the methods, the data stage, the trainer and the runtime, so that each of those imports them
from here and none imports another for a type."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, Optional, Tuple, Union

import torch

IMAGE_EMBEDS = "image_embeds"
"""Extra prompt context of a vision-language target: the language model's input embeddings of the prompt, [P, H]
(training: [B, T, H]), whose rows at image token positions are the image features the projector made."""
IMAGE_MASK = "image_mask"
"""Extra prompt context: which prompt positions hold image tokens, [P] bool (training: [B, T])."""


GEOMETRY = ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim")
"""The TargetInfo fields a trained draft fits: a draft runs only beside a target equal in all of them."""


def geometry_mismatch(trained: "TargetInfo", given: "TargetInfo") -> Optional[str]:
    """How a draft trained for `trained` does not fit `given`, as one phrase naming the first GEOMETRY field that
    differs; None when it fits."""
    name = next((name for name in GEOMETRY if getattr(trained, name) != getattr(given, name)), None)
    if name is None:
        return None
    return (f"the draft was trained for a target with {name}={getattr(trained, name)} ({trained.name_or_path}); "
            f"{given.name_or_path} has {name}={getattr(given, name)}")


@dataclass(frozen=True)
class TargetInfo:
    """Geometry of the frozen target, read from its own config (never from a recipe)."""

    name_or_path: str
    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    architectures: Tuple[str, ...] = ()
    rope_scaling: Optional[Dict[str, Any]] = None
    bos_token_id: Optional[int] = None
    eos_token_id: Optional[int] = None

    @classmethod
    def from_hf_config(cls, config, name_or_path: str) -> "TargetInfo":
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        rope = getattr(text, "rope_parameters", None) or {}
        rope_theta = rope.get("rope_theta", getattr(text, "rope_theta", 10000.0))
        rope_scaling = getattr(text, "rope_scaling", None) or rope
        if (rope_scaling or {}).get("rope_type", "default") == "default":
            rope_scaling = None
        heads = text.num_attention_heads
        eos = text.eos_token_id[0] if isinstance(text.eos_token_id, list) else text.eos_token_id
        return cls(
            name_or_path=name_or_path, model_type=text.model_type, hidden_size=text.hidden_size,
            num_layers=text.num_hidden_layers, num_heads=heads,
            num_kv_heads=getattr(text, "num_key_value_heads", None) or heads,
            head_dim=getattr(text, "head_dim", None) or text.hidden_size // heads,
            intermediate_size=text.intermediate_size, vocab_size=text.vocab_size,
            rms_norm_eps=float(text.rms_norm_eps), rope_theta=float(rope_theta),
            max_position_embeddings=text.max_position_embeddings,
            architectures=tuple(getattr(config, "architectures", None) or ()),
            rope_scaling=dict(rope_scaling) if rope_scaling else None,
            bos_token_id=text.bos_token_id, eos_token_id=eos,
        )

    def to_dict(self) -> Dict[str, Any]:
        """What an export records of the target it was trained for (`from_dict` reads it back)."""
        return {**asdict(self), "architectures": list(self.architectures)}

    @classmethod
    def from_dict(cls, values: Dict[str, Any]) -> "TargetInfo":
        return cls(**{**values, "architectures": tuple(values.get("architectures") or ())})


@dataclass
class BaseDraft:
    """A trained draft another method builds on (a tree classifier or a judge beside it), as the framework loaded
    it: the add-on reads its features, runs it, and serves beside it."""

    method: str
    draft: torch.nn.Module
    method_cfg: Any
    feature_layers: Tuple[int, ...]
    """The target hidden-state indices the base draft reads."""
    runtime: Callable[[Any], Any]
    """runtime target model -> the base draft's runtime drafter (moved to the target's device and dtype)."""
    source: str
    """The export or run directory it came from."""
    base: Optional["BaseDraft"] = None
    """The draft it extends in turn, when it is an add-on itself (a judge's copy of its draft)."""


@dataclass
class DraftContext:
    """What a draft is built from besides its own config."""

    target: TargetInfo
    token_counts: Optional[torch.Tensor] = None
    """[V] int64: how often each target token is an answer token in the training data (None when loading)."""
    activation_checkpointing: Union[str, bool] = "none"
    """What the backward recomputes of each draft step: none, swiglu, selective or full (true is full, false is
    none), as train.activation_checkpointing."""
    compile: bool = False
    """torch.compile the draft's pointwise-heavy layer parts (train.compile, resolved for the device)."""
    warm_start: Optional[torch.nn.Module] = None
    """The trained draft the method's `warm_start` hook names (its `init_from`), loaded by the trainer; the
    method's `initialize` hook copies what it needs from it."""
    base: Optional["BaseDraft"] = None
    """The trained draft an add-on method extends (its `base_draft` hook names it), loaded by every stage."""


@dataclass
class TargetFeatures:
    """The frozen target's outputs that drafts train on, for one batch."""

    hidden_states: Dict[int, torch.Tensor]
    """Index i -> input of decoder layer i, [B, T, H], as Hugging Face's `output_hidden_states` gives it (index 0 is
    the token embeddings, scaled where the family scales them; L the last layer's output after the final norm)."""
    final_hidden: Optional[torch.Tensor] = None
    """[B, T, H] the last hidden state after the final norm (training only): logits = final_hidden @ lm_head.T."""
    lm_head: Optional[torch.Tensor] = None
    """[V, H] the target's LM head weight, so that a method computes only the logits it needs."""
    logit_softcap: Optional[float] = None
    """c of the target's softcap on its final logits, c * tanh(logits / c), where its family has one and its
    config sets it (Gemma 2 and 3: specdraft.targets.head_forms); None: none."""
    embed_tokens: Optional[torch.Tensor] = None
    """[V, H] the target's input embedding table, for a method that embeds tokens besides the batch's own (a block
    drafter's mask token); None where the source keeps none."""
    context: Dict[str, torch.Tensor] = field(default_factory=dict)
    """The prompts' extra context by name, as the runtime hands it to `Drafter.begin` (a vision-language target's
    IMAGE_EMBEDS [B, T, H] and IMAGE_MASK [B, T]); empty for text targets. hidden_states[0] stays the token
    embeddings (the embedding table's rows of input_ids, image tokens included), as the runtime's drafters see them."""

    def logits_for(self, vocab_ids: torch.Tensor) -> torch.Tensor:
        """The target's logits over `vocab_ids` [Vd] only -> [B, T, Vd] (no [B, T, V] tensor)."""
        logits = self.final_hidden @ self.lm_head[vocab_ids].T
        if self.logit_softcap is None:
            return logits
        return self.logit_softcap * torch.tanh(logits / self.logit_softcap)

    def logits_into(self, vocab_ids: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """logits_for(vocab_ids), rows flattened, written into `out` [B*T, Vd] (in `out`'s dtype, no autocast): the
        loss's teacher without a second [B*T, Vd] copy."""
        hidden = self.final_hidden.flatten(0, 1).to(out.dtype)  # [B*T, H]
        with torch.autocast(hidden.device.type, enabled=False):
            torch.matmul(hidden, self.lm_head[vocab_ids].to(out.dtype).T, out=out)
        if self.logit_softcap is not None:
            out.div_(self.logit_softcap).tanh_().mul_(self.logit_softcap)
        return out

    def argmax_in(self, vocab_mask: torch.Tensor, vocab_chunk: int = 16384) -> torch.Tensor:
        """Whether the target's argmax over its whole vocabulary lies in `vocab_mask` [V] -> [B, T] bool.

        Scans the vocabulary in chunks of `vocab_chunk` rows of the LM head, so no [B, T, V] logits exist. A softcap
        keeps the order of the logits, so the raw logits' argmax is the target's."""
        best_value = best_index = None
        for start in range(0, self.lm_head.shape[0], vocab_chunk):
            chunk_max, chunk_index = (self.final_hidden @ self.lm_head[start:start + vocab_chunk].T).max(-1)
            if best_value is None:
                best_value, best_index = chunk_max, chunk_index
            else:  # strict >: ties keep the lower id, as argmax does
                better = chunk_max > best_value
                best_value = torch.where(better, chunk_max, best_value)
                best_index = torch.where(better, chunk_index + start, best_index)
        return vocab_mask[best_index]


@dataclass
class DraftBatch:
    """One training batch: token ids, masks, and the target's features for them."""

    input_ids: torch.Tensor  # [B, T]
    loss_mask: torch.Tensor  # [B, T] 1 on assistant tokens
    attention_mask: torch.Tensor  # [B, T] 1 on real tokens, 0 on padding
    features: Optional[TargetFeatures] = None
    position_ids: Optional[torch.Tensor] = None  # [B, T] packed rows: positions restart at each document
    document_ids: Optional[torch.Tensor] = None  # [B, T] packed rows: document of each token, non-decreasing


@dataclass
class LossOutput:
    loss: torch.Tensor
    metrics: Dict[str, torch.Tensor] = field(default_factory=dict)
    """Scalars to log; `acc@k` (per draft position) and `tau_sim` are aggregated by validation."""
