"""Answer quality beside speed, for any acceptance rule that may change the output (a lossy one): the bench's
prompts checked by a program (specdraft.data.checks: the task suite `tasks:SPLIT`, GSM8K, HumanEval), plain
decoding's answers against the speculative ones.

Retained accuracy is the share of the prompts the target solves by itself (plain decoding) that are still solved
under the rule; a check that fails itself counts as unsolved (never as a success) and is counted apart.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from specdraft.core.errors import SpecdraftError
from specdraft.data.checks import Check, check_of, verdict
from specdraft.data.sources import load_conversations, source_records


def bench_prompts(source: str, max_prompts: Optional[int], with_checks: bool = False
                  ) -> Tuple[List[str], Optional[List[Check]], List[List[str]]]:
    """The first user turn of each prompt of `source` (the first `max_prompts`), (with_checks) each one's check
    (an error naming the first prompt that has none) and each one's image paths (an image prompt set's); read
    without the model, so that a bad file fails before it loads."""
    conversations = load_conversations([source], max_prompts)
    kept = [(c, next(m["content"] for m in c.messages if m["role"] == "user")) for c in conversations
            if c.skip_reason is None]
    if not kept:
        raise SpecdraftError(f"no prompts with a user turn in {source}")
    turns = [text for _, text in kept]
    images = [list(conversation.images) for conversation, _ in kept]
    if not with_checks:
        return turns, None, images
    records = list(source_records(source))
    checks = [check_of(records[conversation.index]) for conversation, _ in kept]
    missing = next((conversation.index for (conversation, _), check in zip(kept, checks) if check is None), None)
    if missing is not None:
        raise SpecdraftError(f"prompt {missing} of {source} has no answer check, which --check-answers needs "
                             f"(prompts of a task set: tasks:, humaneval:, gsm8k:, or GSM8K and HumanEval records)")
    return turns, checks, images


def answer_quality(decode, checks: Sequence[Check], plain_answers: Sequence[List[int]],
                   answers: Sequence[List[int]], timeout_s: float) -> dict:
    """Each prompt's plain and speculative answers (token ids; `decode` makes them text) checked -> accuracy of
    each, retained accuracy (None when plain decoding solves none) and the checks that failed themselves."""
    plain = [verdict(check, decode(tokens), timeout_s) for check, tokens in zip(checks, plain_answers)]
    spec = [verdict(check, decode(tokens), timeout_s) for check, tokens in zip(checks, answers)]
    solved_plain, solved = sum(bool(v) for v in plain), sum(bool(v) for v in spec)
    kept = sum(bool(p) and bool(s) for p, s in zip(plain, spec))
    return {"checked_prompts": len(checks), "solved_plain": solved_plain, "solved": solved,
            "solved_both": kept, "accuracy_plain": solved_plain / max(1, len(checks)),
            "accuracy": solved / max(1, len(checks)),
            "retained_accuracy": kept / solved_plain if solved_plain else None,
            "check_errors": sum(v is None for v in plain + spec)}
