"""Answer checks: whether a model's answer to a prompt is correct, decided by a program (no model, no person).

A prompt record that can be checked says how, by its fields (`check_of`):

  {"prompt": ..., "check": "number", "answer": 12}                 the last number in the answer is 12
  {"prompt": ..., "check": "list", "answer": [2, 5, 9]}            the answer's last 3 items are 2, 5, 9 (numbers,
                                                                   or words of the answer list)
  {"prompt": ..., "check": "text", "answer": "Paris", "reject": ["Alice"]}
                                                                   says Paris (a whole word, any case) and none
                                                                   of the rejected values
  {"prompt": ..., "check": "json", "answer": {"name": "Bob"}}      the first JSON object in it equals this one
  {"question": ..., "answer": "... #### 42"}                       GSM8K: a number check on what follows ####
  {"prompt": ..., "test": ..., "entry_point": ...}                 HumanEval: the answer's code passes the tests,
                                                                   run in a sandboxed subprocess (sandbox.py)

`passes(check, answer, timeout_s)` -> True or False; a checker that fails itself (crashes, times out) raises
`CheckError` instead: its verdict is neither, and whoever labels answers counts an error and labels nothing.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from specdraft.data.sandbox import SandboxError, run_python

NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?")
LIST_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
WORD = re.compile(r"[A-Za-z]+")
CODE_BLOCK = re.compile(r"```(?:python|py)?[^\n]*\n(.*?)(?:```|$)", re.DOTALL)


class CheckError(Exception):
    """The checker itself failed (a crash, a time-out): no verdict on the answer."""


@dataclass(frozen=True)
class Check:
    """How one prompt's answers are checked: a kind of `CHECKS` and what it compares against."""

    kind: str
    expected: Any
    reject: Tuple[str, ...] = ()
    """`text`: values whose presence makes an answer wrong (the other fields of a record, say)."""
    code: Dict[str, str] = field(default_factory=dict)
    """`code`: the prompt's function stub, its tests and its entry point (HumanEval's fields)."""


def check_of(record: Any) -> Optional[Check]:
    """The check a prompt record carries (module docstring), or None when it carries none."""
    if not isinstance(record, Mapping):
        return None
    if "check" in record:
        return Check(str(record["check"]), record.get("answer"), tuple(map(str, record.get("reject") or ())))
    if {"test", "entry_point", "prompt"} <= set(record):
        return Check("code", None, code={key: str(record[key]) for key in ("prompt", "test", "entry_point")})
    answer = record.get("answer")
    if isinstance(answer, str) and "####" in answer:
        return Check("number", answer.split("####")[-1].strip())
    return None


def _as_number(text: Any) -> Optional[float]:
    try:
        return float(str(text).replace(",", "").strip())
    except ValueError:
        return None


def _number(check: Check, answer: str) -> bool:
    numbers = NUMBER.findall(answer)
    expected = _as_number(check.expected)
    if expected is None:
        raise CheckError(f"expected answer {check.expected!r} is not a number")
    return bool(numbers) and abs(_as_number(numbers[-1]) - expected) < 1e-6


def _list(check: Check, answer: str) -> bool:
    expected = list(check.expected)
    if all(_as_number(item) is not None for item in expected):
        found = [_as_number(item) for item in LIST_NUMBER.findall(answer)]
        wanted = [_as_number(item) for item in expected]
    else:
        vocabulary = {str(item).lower() for item in expected}
        found = [word.lower() for word in WORD.findall(answer) if word.lower() in vocabulary]
        wanted = [str(item).lower() for item in expected]
    return len(found) >= len(wanted) and found[len(found) - len(wanted):] == wanted


def _says(text: str, value: str) -> bool:
    return re.search(rf"(?<![\w]){re.escape(value.lower())}(?![\w])", text.lower()) is not None


def _text(check: Check, answer: str) -> bool:
    return _says(answer, str(check.expected)) and not any(_says(answer, value) for value in check.reject)


def first_json_object(text: str) -> Optional[dict]:
    """The first `{...}` in `text` that parses as a JSON object, or None."""
    decoder = json.JSONDecoder()
    for start in (match.start() for match in re.finditer(r"\{", text)):
        try:
            value, _ = decoder.raw_decode(text[start:])
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def _json(check: Check, answer: str) -> bool:
    return first_json_object(answer) == check.expected


def answer_code(stub: str, answer: str, entry_point: str) -> str:
    """The program an answer stands for: its first Python code block (else the whole answer), after the prompt's
    stub when the block does not define the entry point itself (a completion of the stub's body), else after the
    stub's imports (which a rewritten function still needs)."""
    blocks = CODE_BLOCK.findall(answer)
    code = blocks[0] if blocks else answer
    if not re.search(rf"def\s+{re.escape(entry_point)}\s*\(", code):
        return stub + code
    imports = [line for line in stub.splitlines() if line.startswith(("import ", "from "))]
    return "\n".join([*imports, code])


def _code(check: Check, answer: str, timeout_s: float) -> bool:
    program = answer_code(check.code["prompt"], answer, check.code["entry_point"])
    tests = f"{check.code['test']}\ncheck({check.code['entry_point']})\n"
    try:
        return run_python(program, tests, timeout_s)
    except SandboxError as err:
        raise CheckError(str(err)) from None


CHECKS: Dict[str, Callable[[Check, str], bool]] = {"number": _number, "list": _list, "text": _text, "json": _json}
"""The in-process checks by kind (`code` runs in a subprocess: `passes`)."""


def passes(check: Check, answer: str, timeout_s: float = 5.0) -> bool:
    """Whether `answer` is correct for `check`; CheckError when the checker fails (unknown kind, a crash, a
    time-out), never a verdict."""
    if check.kind == "code":
        return _code(check, answer, timeout_s)
    if check.kind not in CHECKS:
        raise CheckError(f"unknown check {check.kind!r}; valid: code, {', '.join(CHECKS)}")
    try:
        return bool(CHECKS[check.kind](check, answer))
    except CheckError:
        raise
    except Exception as err:  # a checker's own bug or a malformed expected answer: no verdict
        raise CheckError(f"check {check.kind!r} failed: {type(err).__name__}: {err}") from None


def verdict(check: Check, answer: str, timeout_s: float = 5.0) -> Optional[bool]:
    """`passes`, or None where the checker failed (no verdict)."""
    try:
        return passes(check, answer, timeout_s)
    except CheckError:
        return None
