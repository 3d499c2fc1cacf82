"""What distillation does to prompts besides templating them: the answer instruction appended to every user turn
(`distill.answer_instruction`, ViSpec's "answer at length"), and a conversation's images, opened for the target
and stored under the output dir by content hash (specdraft.data.images)."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Dict, List, Optional

from specdraft.core.errors import SpecdraftError
from specdraft.data.images import load_image, store_image
from specdraft.data.sources import Conversation
from specdraft.targets.chat import TextChat


def with_instruction(conversation: Conversation, instruction: Optional[str]) -> Conversation:
    """The conversation with `instruction` appended to every user turn (on a line of its own); as it is if None."""
    if not instruction:
        return conversation
    messages = [{**m, "content": f"{m['content']}\n{instruction}"} if m["role"] == "user" else dict(m)
                for m in conversation.messages]
    return replace(conversation, messages=messages)


def check_images(chat: TextChat, conversations: Dict[int, Conversation]) -> None:
    """Image prompts need a target that reads images: one line naming the first conversation with images."""
    with_images = next((c for c in conversations.values() if c.images), None)
    if with_images is not None and not chat.reads_images:
        raise SpecdraftError(f"conversation {with_images.index} of {with_images.source} has images, and the target "
                             f"reads none (no vision tower); use a vision-language target for image prompt sets")


def open_images(conversation: Conversation) -> list:
    """The conversation's images as RGB PIL images (UnreadableImage, naming the file, for a bad one)."""
    return [load_image(path) for path in conversation.images]


def stored_images(conversation: Conversation, out: Path) -> List[str]:
    """The conversation's images stored under the output dir -> their names there (images/<hash><suffix>)."""
    return [store_image(path, out) for path in conversation.images]
