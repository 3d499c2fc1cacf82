"""Vision-language targets: Hugging Face image-text-to-text models (LLaVA 1.5 and NeXT, Qwen2.5-VL, Idefics3 and
SmolVLM, ...) whose language model is of the Llama family, loaded with their processors.

The vision tower and projector run in PyTorch, as the model's own forward runs them; what the language model then
receives, its input embeddings (the image features at the image token positions) and its position ids, is taken
with a forward pre-hook on the language model, which stops the forward there (`language_inputs`). The language
model alone then decodes: the runtime prefills those embeddings (`image_prompt`), training runs the language model
on them (`vision_features`). Token ids always carry each image expanded into its image tokens, as the processor
expands it; the model's extra inputs are made again from the ids and the images (`image_model_inputs`).

Prompts name their images with `<image>` placeholders in a user turn's text (LLaVA's convention);
`with_image_parts` turns them into the content parts that processors' chat templates place. A language model that
takes three-dimensional (M-RoPE) position ids, Qwen2.5-VL's, runs with rotary tables made for each image prompt
(`prompt_rope`): the prompt's own positions, then text positions past them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from specdraft.core.errors import SpecdraftError
from specdraft.core.types import IMAGE_EMBEDS, IMAGE_MASK, TargetFeatures
from specdraft.targets.features import causal_attention, decoder_states, torch_linear
from specdraft.targets.head_forms import logit_softcap

IMAGE_PLACEHOLDER = "<image>"
"""Where a user turn's text places the next of its prompt's images (LLaVA's convention)."""


def is_vision_config(config) -> bool:
    """Whether a Hugging Face config describes a vision-language model (it holds a vision tower's config)."""
    return getattr(config, "vision_config", None) is not None


def model_class(config):
    """The Auto class that builds a model of this config: image-text-to-text for a VLM, else a causal LM."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    return AutoModelForImageTextToText if is_vision_config(config) else AutoModelForCausalLM


def load_processor(source: str, revision: Optional[str], trust_remote_code: bool, what: str):
    """The processor (tokenizer, image processor, chat template) saved with a VLM; its PIL image processor, so that
    torchvision is not needed."""
    from transformers import AutoProcessor

    try:
        return AutoProcessor.from_pretrained(source, revision=revision, trust_remote_code=trust_remote_code,
                                             backend="pil")
    except (OSError, ValueError, TypeError, AttributeError, ImportError) as err:
        raise SpecdraftError(f"cannot load the processor of vision-language target {what!r}: "
                             f"{type(err).__name__}: {(str(err).splitlines() or [''])[0]}") from None


def image_token_id(model) -> int:
    """The token id the processor expands each image into (the model's config names it)."""
    config = model.config
    token = getattr(config, "image_token_id", None)
    token = getattr(config, "image_token_index", None) if token is None else token
    if token is None:
        raise SpecdraftError(f"{type(model).__name__}'s config names no image token (image_token_id)")
    return int(token)


def _image_part(image) -> dict:
    return {"type": "image", "image": image}


def _text_parts(piece: str, after_image: bool, before_image: bool) -> List[dict]:
    """A stretch of text between placeholders as a text part, less the newline that is the placeholder's own."""
    if after_image and piece.startswith("\n"):
        piece = piece[1:]
    if before_image and piece.endswith("\n"):
        piece = piece[:-1]
    return [{"type": "text", "text": piece}] if piece else []


def with_image_parts(messages: List[dict], images: Sequence) -> List[dict]:
    """Messages with string contents -> content-part lists ({"type": "text", "text"} and {"type": "image",
    "image"}), the form processors' chat templates take. Each `<image>` in a user turn takes the next image (a
    newline beside it is the placeholder's, as in LLaVA's `<image>\\n`); without placeholders the images go before
    the first user turn's text."""
    named = sum(m["content"].count(IMAGE_PLACEHOLDER) for m in messages if m["role"] == "user")
    if named not in (0, len(images)):
        raise SpecdraftError(f"the prompt places {named} images with {IMAGE_PLACEHOLDER} but has {len(images)}")
    queue, converted = list(images), []
    for message in messages:
        user = message["role"] == "user"
        parts = [_image_part(queue.pop(0)) for _ in range(len(queue))] if user and named == 0 else []
        pieces = message["content"].split(IMAGE_PLACEHOLDER) if user else [message["content"]]
        for index, piece in enumerate(pieces):
            if index > 0:
                parts.append(_image_part(queue.pop(0)))
            parts += _text_parts(piece, index > 0, index < len(pieces) - 1)
        converted.append({"role": message["role"], "content": parts})
    return converted


def image_model_inputs(processor, model, input_ids: torch.Tensor, images: Sequence[Sequence]) -> Dict:
    """What the model's forward takes besides input_ids [B, T] (ids with every image already expanded into its
    tokens): the image processor's tensors for each row's images (PIL, in order), and the token types a processor
    marks (Qwen2.5-VL's), on the model's device and floats in its dtype."""
    inputs = {"input_ids": input_ids}
    if any(len(row) for row in images):
        pixels = processor.image_processor(images=[list(row) for row in images], return_tensors="pt")
        inputs.update(pixels)
    if getattr(processor, "return_mm_token_type_ids", False):
        inputs["mm_token_type_ids"] = torch.tensor(processor.create_mm_token_type_ids(input_ids.tolist()))
    weight = model.get_input_embeddings().weight
    return {name: value.to(weight.device, weight.dtype) if value.is_floating_point() else value.to(weight.device)
            for name, value in inputs.items()}


class _Reached(Exception):
    """Raised by `language_inputs`' pre-hook with what the language model was given, to stop the forward there."""

    def __init__(self, embeds: torch.Tensor, position_ids: Optional[torch.Tensor]):
        super().__init__("language model reached")
        self.embeds, self.position_ids = embeds, position_ids


@torch.no_grad()
def language_inputs(model, inputs: Dict) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """The model's forward on `inputs` (image_model_inputs) up to its language model -> (input embeddings
    [B, T, H], image features at the image tokens; position ids as the language model takes them: None, or
    [3, B, T] for M-RoPE)."""
    def stop(module, args, kwargs):
        raise _Reached(kwargs["inputs_embeds"], kwargs.get("position_ids"))

    hook = model.get_decoder().register_forward_pre_hook(stop, with_kwargs=True)
    try:
        model(**inputs, use_cache=False)
    except _Reached as reached:
        return reached.embeds, reached.position_ids
    finally:
        hook.remove()
    raise SpecdraftError(f"{type(model).__name__}'s forward never reached its language model")


@dataclass
class PromptInputs:
    """One prompt as the runtime's engine takes it: `engine.generate(prompt.ids, ..., **prompt.engine_kwargs())`."""

    ids: List[int]
    embeds: Optional[torch.Tensor] = None
    """[P, H] the language model's input embeddings, image features at the image tokens (None: the table's)."""
    context: Dict[str, torch.Tensor] = field(default_factory=dict)
    """The drafter's extra prompt context (IMAGE_EMBEDS, IMAGE_MASK); empty for a prompt without images."""
    rope: Optional[Tuple[torch.Tensor, torch.Tensor]] = None
    """The target's rotary tables (cos, sin [max_len, D]) for this prompt (M-RoPE targets); None: the default."""
    text: Optional[str] = None
    """The user turn it was made from, when it was made from one (to make it again for another runtime)."""
    images: List = field(default_factory=list)
    """Its images (PIL), for baselines that run the whole model (Hugging Face generate)."""

    def engine_kwargs(self) -> dict:
        return {"prompt_embeds": self.embeds, "context": self.context, "prompt_rope": self.rope}


def as_prompt(prompt) -> PromptInputs:
    """Token ids (a text prompt) or PromptInputs -> PromptInputs."""
    return prompt if isinstance(prompt, PromptInputs) else PromptInputs(list(prompt))


def prompt_rope(model, position_ids: Optional[torch.Tensor], max_len: int):
    """position_ids as the language model takes them for one prompt of P tokens: None or [1, P] (one dimension:
    the default tables serve) or [3, 1, P] (M-RoPE) -> the rotary tables cos, sin [max_len, D] of the prompt's own
    positions, then of text positions past it (equal in every dimension, from its largest + 1), or None."""
    if position_ids is None or position_ids.dim() < 3:
        return None
    prompt = position_ids[-3:, :1]  # [3, 1, P] (a fourth, leading row would be text positions)
    after = prompt.max() + 1 + torch.arange(max_len - prompt.shape[-1], device=prompt.device)  # [max_len - P]
    positions = torch.cat([prompt, after.view(1, 1, -1).expand(3, 1, -1)], dim=-1)  # [3, 1, max_len]
    probe = torch.zeros(1, max_len, 1, device=positions.device, dtype=torch.float32)
    cos, sin = model.get_decoder().rotary_emb(probe, positions)  # [1, max_len, D] each
    return cos[0], sin[0]


@torch.no_grad()
def image_prompt(model, processor, ids: List[int], images: Sequence, max_len: int) -> PromptInputs:
    """A templated prompt's ids (its images expanded into their tokens) and its images (PIL) -> what the runtime
    prefills: the language model's input embeddings, the drafter's image context, and M-RoPE tables if any."""
    input_ids = torch.tensor([ids], device=model.get_input_embeddings().weight.device)  # [1, P]
    embeds, position_ids = language_inputs(model, image_model_inputs(processor, model, input_ids.cpu(), [images]))
    embeds = embeds[0]  # [P, H]
    mask = input_ids[0] == image_token_id(model)  # [P]
    return PromptInputs(list(ids), embeds, {IMAGE_EMBEDS: embeds, IMAGE_MASK: mask},
                        prompt_rope(model, position_ids, max_len), images=list(images))


@torch.no_grad()
def vision_features(model, processor, input_ids: torch.Tensor, images: Sequence[Sequence],
                    layers: Sequence[int]) -> TargetFeatures:
    """Right-padded rows input_ids [B, T] (images expanded into their tokens) with each row's images -> the
    target's features as `capture_features` gives a text target's, plus the image context (IMAGE_EMBEDS [B, T, H],
    IMAGE_MASK [B, T]). hidden_states[0] holds the embedding table's rows of input_ids (what the runtime's
    drafters look up), the image features are IMAGE_EMBEDS' rows at the image tokens."""
    embeds, position_ids = language_inputs(model, image_model_inputs(processor, model, input_ids.cpu(), images))
    decoder_inputs = {"inputs_embeds": embeds}
    if position_ids is not None:
        decoder_inputs["position_ids"] = position_ids
    keep = sorted(set(layers) | {0})
    with causal_attention(model), torch_linear():
        states, final_hidden = decoder_states(model.get_decoder(), decoder_inputs, keep)
    states[0] = model.get_input_embeddings()(input_ids).to(embeds.dtype)  # [B, T, H]
    context = {IMAGE_EMBEDS: embeds, IMAGE_MASK: input_ids == image_token_id(model)}
    return TargetFeatures(hidden_states=states, final_hidden=final_hidden,
                          lm_head=model.get_output_embeddings().weight, logit_softcap=logit_softcap(model.config),
                          context=context)
