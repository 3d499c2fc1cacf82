"""Prompt sets -> conversations whose assistant turns `distill-data` regenerates.

A prompt set is a local `.jsonl`, `.json` (a list of records) or their `.gz` twins, `hf:ID[:SPLIT]` (a Hugging
Face dataset, split `train` unless named) or a checked task set (task_sets.py: `tasks:SPLIT[:RANGE]`, the template
suite; `humaneval:SPLIT[:RANGE]`; `gsm8k:FILE[:RANGE]`). The format is detected per record from its fields:

  conversations   ShareGPT: [{"from": "human"|"gpt"|"system", "value": ...}, ...]
  messages        OpenAI: [{"role": "user"|"assistant"|"system", "content": ...}, ...]
  instruction     Alpaca: "instruction" and an optional "input"
  prompt/question a single user turn
  turns           MT-bench: a list of user turns

Only the system prompt and the user turns are kept; each user turn is followed by an assistant placeholder (content
"") that distillation fills with the target's own answer. Leading assistant turns are dropped, consecutive turns of
one speaker are joined, and a record without any user turn is kept with a `skip_reason` so that counts add up.

Image prompts (for vision-language targets) add the record's image files beside any of the forms above:

  image           one image file: {"image": "images/cat.png", "conversations": [...]} (LLaVA's JSON form)
  images          several: {"images": ["a.png", "b.png"], "messages": [...]}

A relative path is relative to the prompt file's folder (a file of an `hf:` set: to the working directory). A user
turn's text places each image with an `<image>` placeholder (LLaVA's `<image>\n...`); without placeholders the
images precede the first user turn's text. A missing or unreadable image is counted as an error of its
conversation when it is distilled, never when the set is read.
"""
from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, List, Optional, Tuple

from specdraft.core.errors import SpecdraftError
from specdraft.core.io import package_file, reading, resolve_file
from specdraft.data.task_sets import FORMS as TASK_SET_FORMS
from specdraft.data.task_sets import is_task_set, task_set_records

MAX_CONVERSATION_CHARS = 1_000_000
"""The most characters a conversation's turns may hold together: beyond any target's context (a million characters
are some 250,000 tokens), and what a tokenizer is never handed (one of 100 MB aborted the process)."""
SUPPORTED_FIELDS = ("conversations", "messages", "instruction", "prompt", "question", "turns")
EXTENSIONS = (".jsonl", ".json", ".jsonl.gz", ".json.gz")
ROLE_ALIASES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                "chatgpt": "assistant", "bard": "assistant", "bing": "assistant", "model": "assistant",
                "system": "system"}


@dataclass
class Conversation:
    """One conversation of a prompt set: `messages` is [system?] + (user, assistant placeholder) * turns."""
    source: str
    """The prompt file or `hf:` dataset id it came from."""
    index: int
    """Its record number (0-based) in that source."""
    messages: List[dict]
    """{"role", "content"} dicts; assistant contents are "" placeholders."""
    skip_reason: Optional[str] = None
    """Why it cannot be distilled (e.g. no user turn); None when it can."""
    images: List[str] = field(default_factory=list)
    """Its image files (paths as resolved against the prompt file's folder), in the order its turns place them."""

    @property
    def num_turns(self) -> int:
        return sum(message["role"] == "user" for message in self.messages)


class _FormatError(ValueError):
    """A record that matches no supported format (turned into a SpecdraftError naming file and index)."""


def _text(value, what: str) -> str:
    """A turn's content as text; OpenAI content-part lists keep their text parts."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(part, dict) for part in value):
        return "".join(str(part.get("text", "")) for part in value if part.get("type", "text") == "text")
    raise _FormatError(f"{what} is {type(value).__name__}, expected a string")


def _turns_from_dicts(items, role_key: str, content_key: str) -> List[Tuple[str, str]]:
    """[(role, text)] from ShareGPT/OpenAI turn dicts; roles are mapped through ROLE_ALIASES."""
    if not isinstance(items, list):
        raise _FormatError(f"expected a list of turns, got {type(items).__name__}")
    turns = []
    for number, item in enumerate(items):
        if not isinstance(item, dict) or role_key not in item or content_key not in item:
            raise _FormatError(f"turn {number} lacks {role_key!r}/{content_key!r}")
        role = ROLE_ALIASES.get(str(item[role_key]).lower())
        if role is None:
            raise _FormatError(f"turn {number} has unknown {role_key} {item[role_key]!r}; "
                               f"valid: {', '.join(ROLE_ALIASES)}")
        turns.append((role, _text(item[content_key], f"turn {number} {content_key}")))
    return turns


def _alpaca_turns(record: dict) -> List[Tuple[str, str]]:
    instruction = _text(record["instruction"], "instruction")
    extra = _text(record.get("input") or "", "input")
    return [("user", f"{instruction}\n\n{extra}" if extra.strip() else instruction)]


def _mtbench_turns(record: dict) -> List[Tuple[str, str]]:
    if not isinstance(record["turns"], list):
        raise _FormatError("turns is not a list of strings")
    turns = []
    for i, turn in enumerate(record["turns"]):  # separate questions: each gets its own answer
        turns += [("user", _text(turn, f"turns[{i}]")), ("assistant", "")]
    return turns


def record_turns(record) -> List[Tuple[str, str]]:
    """[(role, text)] of one record, whatever its format; raises _FormatError for an unknown one."""
    if not isinstance(record, dict):
        raise _FormatError(f"record is {type(record).__name__}, expected an object")
    if "conversations" in record:
        turns = _turns_from_dicts(record["conversations"], "from", "value")
    elif "messages" in record:
        turns = _turns_from_dicts(record["messages"], "role", "content")
    elif "instruction" in record:
        turns = _alpaca_turns(record)
    elif "prompt" in record or "question" in record:
        turns = [("user", _text(record.get("prompt", record.get("question")), "prompt"))]
    elif "turns" in record:
        turns = _mtbench_turns(record)
    else:
        raise _FormatError(f"no known field among {sorted(record)[:8]}")
    system = record.get("system")
    if isinstance(system, str) and system.strip() and not any(role == "system" for role, _ in turns):
        turns.insert(0, ("system", system))
    return turns


def conversation_messages(turns: List[Tuple[str, str]]) -> List[dict]:
    """[system?] + (user, assistant "") per user turn: leading assistant turns dropped, same-speaker runs joined.

    The system prompt is the first system turn before the first user turn; later system turns are dropped.
    """
    first_user = next((i for i, (role, _) in enumerate(turns) if role == "user"), len(turns))
    system = [text for role, text in turns[:first_user] if role == "system"][:1]
    users: List[str] = []
    previous = None
    for role, text in turns:
        if role == "user" and previous == "user":
            users[-1] = f"{users[-1]}\n\n{text}"
        elif role == "user":
            users.append(text)
        previous = role if role != "system" else previous
    messages = [{"role": "system", "content": system[0]}] if system else []
    for text in users:
        messages += [{"role": "user", "content": text}, {"role": "assistant", "content": ""}]
    return messages


def _open_text(path: Path):
    return gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else open(path, encoding="utf-8")


def _jsonl_records(path: Path) -> Iterator:
    with _open_text(path) as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as err:
                raise SpecdraftError(f"cannot parse JSON in {path} line {line_number}: {err.msg}") from None


def _json_records(path: Path) -> list:
    with _open_text(path) as handle:
        try:
            records = json.load(handle)
        except json.JSONDecodeError as err:
            raise SpecdraftError(f"cannot parse JSON in {path} line {err.lineno}: {err.msg}") from None
    if not isinstance(records, list):
        raise SpecdraftError(f"{path} holds a JSON {type(records).__name__}; expected a list of records "
                             f"(or use .jsonl, one record per line)")
    return records


def _file_records(path_text: str) -> Iterable:
    if not path_text.endswith(EXTENSIONS):
        raise SpecdraftError(f"prompt set {path_text!r} has an unknown extension; valid: "
                             f"{', '.join(EXTENSIONS)}, hf:ID[:SPLIT] or a task set: {', '.join(TASK_SET_FORMS)}")
    path = resolve_file(path_text, "prompt file")
    with reading(path, "prompt file"):  # bad bytes, a broken gzip stream, JSON nested past Python's recursion limit
        if path.name.endswith((".jsonl", ".jsonl.gz")):
            yield from _jsonl_records(path)
        else:
            yield from _json_records(path)


def _hf_records(spec: str) -> Iterable:
    """Records of `hf:ID[:SPLIT]` through datasets.load_dataset (split `train` unless named)."""
    from datasets import load_dataset

    dataset_id, _, split = spec[len("hf:"):].partition(":")
    if not dataset_id:
        raise SpecdraftError(f"prompt set {spec!r} names no dataset; write hf:ID or hf:ID:SPLIT")
    try:
        dataset = load_dataset(dataset_id, split=split or "train")
    except Exception as err:  # datasets raises many kinds (missing, offline, bad split)
        first_line = (str(err).splitlines() or [""])[0]
        raise SpecdraftError(f"cannot load prompt set {spec!r}: {type(err).__name__}: {first_line}") from None
    return iter(dataset)


def source_records(source: str) -> Iterable:
    """The raw records of one prompt set, in order."""
    if is_task_set(source):
        return iter(task_set_records(source))
    return _hf_records(source) if source.startswith("hf:") else _file_records(source)


def record_images(record: dict, folder: Path) -> List[str]:
    """The record's image files (`image` or `images`), relative paths resolved against `folder`."""
    names = record.get("images", record.get("image"))
    if names is None:
        return []
    names = [names] if isinstance(names, str) else names
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise _FormatError("image/images must be a file path or a list of file paths")
    return [str(folder / name) if not Path(name).is_absolute() else name for name in names]


def _conversation(source: str, index: int, record, folder: Path) -> Conversation:
    try:
        messages = conversation_messages(record_turns(record))
        images = record_images(record, folder)
    except _FormatError as err:
        raise SpecdraftError(f"record {index} of {source} has an unknown format ({err}); supported fields: "
                             f"{', '.join(SUPPORTED_FIELDS)}") from None
    size = sum(len(message["content"]) for message in messages)
    if size > MAX_CONVERSATION_CHARS:
        raise SpecdraftError(f"record {index} of {source} holds {size:,} characters, more than the "
                             f"{MAX_CONVERSATION_CHARS:,} a conversation may (beyond any target's context); cut it "
                             f"or leave it out")
    has_user = any(message["role"] == "user" for message in messages)
    return Conversation(source, index, messages, None if has_user else "no user turn", images)


def _image_folder(source: str) -> Path:
    """Where a prompt set's relative image paths start: its file's folder (the working directory for `hf:`)."""
    if source.startswith("hf:") or is_task_set(source):
        return Path(".")
    return package_file(source).parent if source.startswith("pkg:") else Path(source).expanduser().parent


def load_conversations(paths: List[str], max_samples: Optional[int] = None) -> List[Conversation]:
    """All conversations of the prompt sets, in order, at most `max_samples` in all.

    Raises SpecdraftError for no prompt sets, a missing/unreadable file, a record of unknown format, or a prompt
    set without any record.
    """
    if not paths:
        raise SpecdraftError("no prompt sets given; set data.prompts to JSON/JSONL files or hf:ID[:SPLIT]")
    conversations: List[Conversation] = []
    for source in paths:
        if max_samples is not None and len(conversations) >= max_samples:
            break
        before, folder = len(conversations), _image_folder(source)
        for index, record in enumerate(source_records(source)):
            if max_samples is not None and len(conversations) >= max_samples:
                break
            conversations.append(_conversation(source, index, record, folder))
        if len(conversations) == before:
            raise SpecdraftError(f"no prompts in {source}")
    if not conversations:
        raise SpecdraftError(f"no prompts in {', '.join(paths)} (data.max_samples={max_samples})")
    return conversations
