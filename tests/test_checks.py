"""The task suite and its answer checks (CPU, no model): every template's items pass their check with a correct
answer and fail with a wrong one; the splits are disjoint and stable; GSM8K and HumanEval records are checked;
code runs in a sandbox with a time limit and no file or network access; a checker that fails gives no verdict."""
import json

import pytest

from specdraft.core.errors import SpecdraftError
from specdraft.data import checks
from specdraft.data.checks import Check, CheckError, check_of, passes, verdict
from specdraft.data.sandbox import SandboxError, run_python
from specdraft.data.sources import load_conversations
from specdraft.data.tasks import TEMPLATES, task_records


def _correct(record: dict) -> str:
    answer = record["answer"]
    if record["check"] == "list":
        return "Here they are: " + ", ".join(map(str, answer)) + "."
    if record["check"] == "json":
        return f"```json\n{json.dumps(answer, indent=2)}\n```\nThis object has {len(answer)} keys."
    return f"The answer is {answer}."


def _wrong(record: dict) -> str:
    answer = record["answer"]
    if record["check"] == "list":
        return ", ".join(map(str, answer[::-1]))
    if record["check"] == "json":
        return json.dumps({**answer, "extra": 1})
    if record["check"] == "number":
        return f"The answer is {answer + 1}."
    return "I do not know."


@pytest.mark.parametrize("split", sorted(TEMPLATES))
def test_every_template_s_items_pass_their_check_when_right_and_fail_when_wrong(split):
    records = task_records(split, 6 * len(TEMPLATES[split]))
    assert {record["template"] for record in records} == {template.__name__ for template in TEMPLATES[split]}
    for record in records:
        check = check_of(record)
        assert passes(check, _correct(record)), record
        assert not passes(check, _wrong(record)), record


def test_splits_are_disjoint_templates_and_items_do_not_depend_on_the_count():
    assert not {t.__name__ for t in TEMPLATES["train"]} & {t.__name__ for t in TEMPLATES["heldout"]}
    assert task_records("train", 7) == task_records("train", 30)[:7]
    conversations = load_conversations(["tasks:heldout:5"])
    first = task_records("heldout", 1)[0]["prompt"]
    assert len(conversations) == 5 and conversations[0].messages[0]["content"] == first
    with pytest.raises(SpecdraftError, match="unknown task split 'dev'; valid: heldout, train"):
        load_conversations(["tasks:dev"])
    for bad in ("tasks:train:lots", "tasks:train:0", "tasks:train:5..5", "tasks:train:..4"):
        with pytest.raises(SpecdraftError, match="write tasks:SPLIT:COUNT with a positive integer COUNT"):
            load_conversations([bad])


def test_a_range_of_items_is_the_same_items_as_in_the_whole_split():
    later = load_conversations(["tasks:heldout:30..34"])
    assert [c.messages[0]["content"] for c in later] == [r["prompt"] for r in task_records("heldout", 34)[30:]]


@pytest.mark.parametrize("kind, expected, answer, verdict_", [
    ("number", 13, "5 + 8 = 13.", True),
    ("number", 3000, "3 kilometers is 3,000 meters.", True),
    ("number", 13, "13 is not it: 5 + 8 = 14", False),
    ("list", [2, 5, 9], "Sorting 5, 2, 9 gives 2, 5, 9.", True),
    ("list", [2, 5, 9], "2, 9, 5", False),
    ("list", ["plum", "pear", "apple"], "Reversed: Plum, pear and apple.", True),
    ("json", {"name": "Bob", "age": 3}, 'Sure: {"name": "Bob", "age": 3} is it', True),
    ("json", {"name": "Bob", "age": 3}, '{"name": "Bob"}', False),
])
def test_check_kinds(kind, expected, answer, verdict_):
    assert passes(Check(kind, expected), answer) is verdict_


def test_text_checks_whole_words_and_rejects_the_other_fields():
    check = Check("text", "Paris", ("Alice",))
    assert passes(check, "She lives in paris.") and not passes(check, "Parisian") and not passes(check, "Alice, Paris")


def test_records_of_gsm8k_and_humaneval_carry_their_checks():
    gsm8k = check_of({"question": "How many?", "answer": "Two and two.\n#### 1,204"})
    assert gsm8k.kind == "number" and passes(gsm8k, "So 1204 in all.") and not passes(gsm8k, "1203")
    assert check_of({"prompt": "hello"}) is None and check_of("text") is None
    humaneval = check_of({"prompt": "def add(a, b):\n", "test": "def check(f):\n    assert f(2, 3) == 5\n",
                          "entry_point": "add"})
    assert humaneval.kind == "code"
    assert passes(humaneval, "```python\ndef add(a, b):\n    return a + b\n```")
    assert passes(humaneval, "    return a + b\n")  # a completion of the stub's body
    assert not passes(humaneval, "    return a - b\n") and not passes(humaneval, "not python at all")
    typed = check_of({"prompt": "from typing import List\n\ndef total(xs: List[int]) -> int:\n",
                      "test": "def check(f):\n    assert f([1, 2]) == 3\n", "entry_point": "total"})
    assert passes(typed, "```python\ndef total(xs: List[int]) -> int:\n    return sum(xs)\n```")  # the stub's imports


def test_code_runs_sandboxed_with_a_time_limit(tmp_path):
    target = tmp_path / "written"
    for program in (f"open({str(target)!r}, 'w').write('x')", "import socket", "import os\nos.system('true')",
                    "import subprocess", f"import pathlib\npathlib.Path({str(target)!r}).write_text('x')"):
        assert run_python(program, "", timeout_s=5) is False, program
    assert not target.exists()
    assert run_python("import math\nvalue = math.sqrt(16)", "assert value == 4", timeout_s=5) is True
    with pytest.raises(SandboxError, match="ran past 0.5 s"):
        run_python("while True:\n    pass\n", "", timeout_s=0.5)
    looping = Check("code", None, code={"prompt": "def f():\n", "test": "def check(f):\n    f()\n", "entry_point": "f"})
    with pytest.raises(CheckError):
        passes(looping, "    while True:\n        pass\n", timeout_s=0.5)
    assert verdict(looping, "    while True:\n        pass\n", timeout_s=0.5) is None


def test_a_checker_that_fails_gives_no_verdict(monkeypatch):
    monkeypatch.setitem(checks.CHECKS, "broken", lambda check, answer: 1 / 0)
    assert verdict(Check("broken", None), "anything") is None
    with pytest.raises(CheckError, match="unknown check 'nope'"):
        passes(Check("nope", None), "anything")
    assert verdict(Check("number", "not a number"), "12") is None
