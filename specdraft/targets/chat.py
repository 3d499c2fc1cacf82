"""Chat prompts as token ids: a target's chat template applied to messages ({"role", "content": text}). A
vision-language target's processor also places the prompt's images (where its user turns name them with
`<image>`, else before the first user turn's text) and expands each into the image's tokens."""
from __future__ import annotations

from typing import List, Sequence

from specdraft.core.errors import SpecdraftError
from specdraft.targets.vision import with_image_parts


def template_ids(tokenizer, messages: List[dict], add_generation_prompt: bool = False) -> List[int]:
    """Token ids of the chat template applied to `messages` (transformers 5 may return a BatchEncoding)."""
    result = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=add_generation_prompt)
    return list(result["input_ids"] if hasattr(result, "keys") else result)


class TextChat:
    """A text target's prompts: its tokenizer's chat template."""

    reads_images = False

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def ids(self, messages: List[dict], images: Sequence = (), add_generation_prompt: bool = False) -> List[int]:
        """The templated messages' token ids (with images: each expanded into its tokens)."""
        if images:
            raise SpecdraftError(f"the prompt has {len(images)} images, and this target reads none (it has no vision "
                                 f"tower); use a vision-language target or a text prompt set")
        return template_ids(self.tokenizer, messages, add_generation_prompt)


class VisionChat(TextChat):
    """A vision-language target's prompts: its processor's chat template, images placed and expanded."""

    reads_images = True

    def __init__(self, processor):
        super().__init__(processor.tokenizer)
        self.processor = processor

    def ids(self, messages: List[dict], images: Sequence = (), add_generation_prompt: bool = False) -> List[int]:
        encoded = self.processor.apply_chat_template(with_image_parts(messages, images), tokenize=True,
                                                     return_dict=True, add_generation_prompt=add_generation_prompt)
        ids = encoded["input_ids"]
        return list(ids[0] if len(ids) and isinstance(ids[0], (list, tuple)) else ids)
