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
  {"prompt": ..., "check": "code", "stub": ..., "test": ..., "entry_point": ...}
                                                                   the same, the prompt a request around the stub
                                                                   (task_sets.py's HumanEval items)

A code answer's program (`answer_code`): its first code block that defines the entry point (else its first block,
else the answer itself, cut to the code in it), after the whole stub (its imports and helper functions; a function
the answer defines again replaces the stub's; a stub that is no whole Python: its imports) or, where the answer
completes the stub's body, the stub and then it.

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
    if record.get("check") == "code":
        fields = {"prompt": record.get("stub"), "test": record.get("test"), "entry_point": record.get("entry_point")}
        return Check("code", None, code={key: str(value or "") for key, value in fields.items()})
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


def _defines(code: str, entry_point: str) -> bool:
    """Whether code defines the entry point at its margin (a rewritten function, not the rest of the stub's)."""
    return re.search(rf"^def\s+{re.escape(entry_point)}\s*\(", code, re.MULTILINE) is not None


def _compiles(source: str) -> bool:
    try:
        compile(source, "<answer>", "exec", dont_inherit=True)  # parsed, never run
    except Exception:  # SyntaxError, a null byte, nesting too deep for the parser
        return False
    return True


def _code_lines(head: str, code: str) -> str:
    """The longest run of `code`'s first lines that compiles after `head` (all of it where it does; an answer
    without a code block may end in prose)."""
    lines = code.splitlines(keepends=True)
    for end in range(len(lines), 0, -1):
        if _compiles(head + "".join(lines[:end])):
            return "".join(lines[:end])
    return code


def _unfenced_code(stub: str, answer: str, entry_point: str) -> str:
    """The code of an answer without a code block: from its first line of code at the margin where it defines
    the entry point (prose may come first), else all of it (the rest of the stub's body); cut where prose starts."""
    if _defines(answer, entry_point):
        start = re.search(r"^(?:def|class|import|from|@)\b", answer, re.MULTILINE)
        code = answer[start.start():]
        return _code_lines(_stub_head(stub) + "\n", code)
    return _code_lines(stub, answer)


def answer_code(stub: str, answer: str, entry_point: str) -> str:
    """The program an answer stands for (module docstring): its code after the whole stub where it defines the
    entry point itself, else the stub and then the answer as the rest of the stub's body."""
    blocks = CODE_BLOCK.findall(answer)
    defining = [block for block in blocks if _defines(block, entry_point)]
    code = (defining or blocks)[0] if blocks else _unfenced_code(stub, answer, entry_point)
    if not _defines(code, entry_point):
        return stub + code
    return "\n".join([_stub_head(stub), code])


def _stub_head(stub: str) -> str:
    """What a rewritten function keeps of the stub: all of it where it is whole Python (its docstring the body),
    else its imports."""
    if _compiles(stub):
        return stub
    return "\n".join(line for line in stub.splitlines() if line.startswith(("import ", "from ")))


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
