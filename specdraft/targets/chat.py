"""Chat prompts as token ids: a target's chat template applied to messages ({"role", "content": text}), or the plain
form that target.prompt_format gives a target without one (a base model). A vision-language target's processor also
places the prompt's images (where its user turns name them with `<image>`, else before the first user turn's text)
and expands each into the image's tokens."""
from __future__ import annotations

from typing import List, Sequence

from specdraft.core.errors import SpecdraftError
from specdraft.targets.vision import with_image_parts


def template_ids(tokenizer, messages: List[dict], add_generation_prompt: bool = False) -> List[int]:
    """Token ids of the chat template applied to `messages` (transformers 5 may return a BatchEncoding)."""
    result = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=add_generation_prompt)
    return list(result["input_ids"] if hasattr(result, "keys") else result)


def _no_images(images: Sequence) -> None:
    if images:
        raise SpecdraftError(f"the prompt has {len(images)} images, and this target reads none (it has no vision "
                             f"tower); use a vision-language target or a text prompt set")


class TextChat:
    """A text target's prompts: its tokenizer's chat template."""

    reads_images = False

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    @property
    def forms_prompts(self) -> bool:
        """Whether prompts get a form (a chat template or a plain form); without one a prompt is its text's tokens."""
        return bool(self.tokenizer.chat_template)

    def ids(self, messages: List[dict], images: Sequence = (), add_generation_prompt: bool = False) -> List[int]:
        """The templated messages' token ids (with images: each expanded into its tokens)."""
        _no_images(images)
        return template_ids(self.tokenizer, messages, add_generation_prompt)


class PlainChat(TextChat):
    """A target without a chat template (a base model), in target.prompt_format's plain form: the tokenizer's BOS
    (where it adds one), then each turn: a system turn's text and a newline, a user turn's text in the format
    (`{prompt}`), an answer's text and the EOS token. Each turn is tokenized on its own and the ids joined, so that a
    conversation's prefixes are prefixes of its ids (distill-data's loss mask needs it); the generation prompt adds
    nothing (the format ends where the answer begins)."""

    def __init__(self, tokenizer, prompt_format: str):
        super().__init__(tokenizer)
        self.prompt_format = prompt_format
        bos = tokenizer.bos_token_id
        self.start_ids = [bos] if bos is not None and bos in tokenizer("")["input_ids"] else []

    @property
    def forms_prompts(self) -> bool:
        return True

    def turn_ids(self, message: dict) -> List[int]:
        role, content = message["role"], message["content"]
        if role == "user":
            return self.text_ids(self.prompt_format.format(prompt=content))
        if role == "assistant":
            eos = self.tokenizer.eos_token_id
            return self.text_ids(content) + ([eos] if eos is not None else [])
        if role == "system":
            return self.text_ids(content + "\n")
        raise ValueError(f"target.prompt_format's plain form has no place for a {role!r} turn (user, assistant, "
                         f"system)")

    def text_ids(self, text: str) -> List[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def ids(self, messages: List[dict], images: Sequence = (), add_generation_prompt: bool = False) -> List[int]:
        _no_images(images)
        return self.start_ids + [token for message in messages for token in self.turn_ids(message)]


class VisionChat(TextChat):
    """A vision-language target's prompts: its processor's chat template, images placed and expanded."""

    reads_images = True
    forms_prompts = True

    def __init__(self, processor):
        super().__init__(processor.tokenizer)
        self.processor = processor

    def ids(self, messages: List[dict], images: Sequence = (), add_generation_prompt: bool = False) -> List[int]:
        encoded = self.processor.apply_chat_template(with_image_parts(messages, images), tokenize=True,
                                                     return_dict=True, add_generation_prompt=add_generation_prompt)
        ids = encoded["input_ids"]
        return list(ids[0] if len(ids) and isinstance(ids[0], (list, tuple)) else ids)
