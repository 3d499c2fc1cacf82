"""The checked task sets (specdraft/data/task_sets.py) as prompt sets, CPU, no model: HumanEval's train/held-out
split is deterministic and disjoint, a right answer passes its check and a wrong one fails (HumanEval's on a few
problems only: each check is a sandboxed subprocess), code is found in fenced and raw answers, an endless loop is
no verdict; GSM8K items check the `#### N`; every spec form reads, and a bad one is one line naming the forms."""
import hashlib
import json
from pathlib import Path

import pytest

from specdraft.core.errors import SpecdraftError
from specdraft.data.checks import answer_code, check_of, passes, verdict
from specdraft.data.sources import load_conversations, source_records
from specdraft.data.task_sets import (CODE_INSTRUCTION, HUMANEVAL_TRAIN, MATH_INSTRUCTION, humaneval_problems,
                                      humaneval_split, split_file_spec, task_set_records)

SHARED_GSM8K = Path(__file__).resolve().parents[1].parent.parent / "shared" / "data" / "gsm8k"
CHECKED = ("HumanEval/0", "HumanEval/10", "HumanEval/38")
"""Problems whose checks run here: a list function, one with a helper the stub defines, one with two functions."""


def _problem(task_id: str) -> dict:
    return next(problem for problem in humaneval_problems() if problem["task_id"] == task_id)


def _item(task_id: str) -> dict:
    return next(item for split in ("train", "heldout") for item in task_set_records(f"humaneval:{split}")
                if item["task_id"] == task_id)


def test_humaneval_splits_by_task_id_hash_disjoint_and_whole():
    train, heldout = humaneval_split("train"), humaneval_split("heldout")
    assert len(train) == HUMANEVAL_TRAIN == 100 and len(heldout) == 64
    ids = [problem["task_id"] for problem in train + heldout]
    assert sorted(ids) == sorted(problem["task_id"] for problem in humaneval_problems()) and len(set(ids)) == 164
    digests = [hashlib.sha256(task_id.encode()).hexdigest() for task_id in ids]
    assert digests == sorted(digests)  # the split order is the hash order: any first COUNT is a spread
    assert [item["task_id"] for item in task_set_records("humaneval:train")] == ids[:100]
    assert task_set_records("humaneval:heldout:3") == task_set_records("humaneval:heldout")[:3]
    assert task_set_records("humaneval:heldout:10..12") == task_set_records("humaneval:heldout")[10:12]


def test_a_humaneval_item_asks_for_the_function_and_carries_its_tests():
    item = task_set_records("humaneval:train:1")[0]
    problem = _problem(item["task_id"])
    assert item["prompt"].startswith(CODE_INSTRUCTION + "\n\n```python\n")
    assert problem["prompt"].strip() in item["prompt"]
    check = check_of(item)
    assert check.kind == "code" and check.code == {"prompt": problem["prompt"], "test": problem["test"],
                                                   "entry_point": problem["entry_point"]}
    conversation = load_conversations(["humaneval:train:1"])[0]
    assert conversation.messages[0] == {"role": "user", "content": item["prompt"]}


@pytest.mark.parametrize("task_id", CHECKED)
def test_humaneval_checks_pass_the_canonical_solution_in_any_form_and_fail_a_broken_one(task_id):
    problem, check = _problem(task_id), check_of(_item(task_id))
    whole = problem["prompt"] + problem["canonical_solution"]
    right = {"a fenced whole function": f"Here it is:\n```python\n{whole}```\nIt loops once.",
             "a fenced body": f"```python\n{problem['canonical_solution']}```",
             "a raw completion of the body": problem["canonical_solution"],
             "a raw function between prose": f"Sure.\n\n{whole}\nThat is all.\n"}
    for form, answer in right.items():
        assert passes(check, answer, timeout_s=10), form
    signature = next(line for line in problem["prompt"].splitlines()
                     if line.startswith(f"def {problem['entry_point']}("))
    broken = f"```python\n{signature}\n    return None\n```"
    assert not passes(check, broken, timeout_s=10)
    assert not passes(check, "I cannot write this function.", timeout_s=10)


def test_an_endless_answer_times_out_with_no_verdict():
    problem = _problem("HumanEval/0")
    check = check_of(_item("HumanEval/0"))
    assert verdict(check, "    while True:\n        pass\n", timeout_s=1) is None
    assert problem["entry_point"] == "has_close_elements"


def test_answer_code_picks_the_block_that_defines_the_function_and_keeps_the_stub_s_helpers():
    stub = "import math\n\ndef helper(x):\n    return x + 1\n\ndef f(x):\n    \"\"\"Doc.\"\"\"\n"
    answer = ("Use it like this:\n```python\nprint(f(2))\n```\nThe code:\n"
              "```python\ndef f(x):\n    return helper(x)\n```")
    program = answer_code(stub, answer, "f")
    assert program.startswith(stub) and program.endswith("def f(x):\n    return helper(x)\n")
    assert "print(f(2))" not in program
    assert answer_code(stub, "    return 3\n", "f") == stub + "    return 3\n"
    assert answer_code(stub, "    return 3\nThis returns three.\n", "f") == stub + "    return 3\n"  # prose cut


def _write_gsm8k(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_gsm8k_items_check_the_final_number(tmp_path):
    rows = [{"question": "Tom has 2 boxes of 602 pens. How many pens?", "answer": "2 * 602 = 1204\n#### 1,204"},
            {"question": "Half of 5?", "answer": "5 / 2 = 2.5\n#### 2.5"}]
    path = _write_gsm8k(tmp_path / "test.jsonl", rows)
    items = task_set_records(f"gsm8k:{path}")
    assert [item["answer"] for item in items] == [1204, 2.5]
    assert items[0]["prompt"] == f"{rows[0]['question']}\n{MATH_INSTRUCTION}"
    assert [item["task_id"] for item in items] == ["gsm8k/test.jsonl/0", "gsm8k/test.jsonl/1"]
    first, second = (check_of(item) for item in items)
    assert passes(first, "2 boxes of 602 pens make 1,204 pens.\nThe answer is $1,204.")
    assert passes(first, "So he has \\boxed{1204}")
    assert not passes(first, "He has 1,204 pens, or 1203 without the broken one.")
    assert passes(second, "Half of 5 is 2.50.") and not passes(second, "Half of 5 is 2.")
    assert task_set_records(f"gsm8k:{path}:1..2") == items[1:]
    assert [c.messages[0]["content"] for c in load_conversations([f"gsm8k:{path}:1"])] == [items[0]["prompt"]]


def test_gsm8k_files_with_colons_and_bad_records(tmp_path):
    folder = tmp_path / "a:b"
    folder.mkdir()
    path = _write_gsm8k(folder / "train.jsonl", [{"question": "1 + 1?", "answer": "#### 2"}])
    assert split_file_spec(f"gsm8k:{path}:0..1", "gsm8k:") == (str(path), "0..1")
    assert split_file_spec(f"gsm8k:{path}", "gsm8k:") == (str(path), "")
    assert len(task_set_records(f"gsm8k:{path}")) == 1
    bad = _write_gsm8k(tmp_path / "bad.jsonl", [{"question": "1 + 1?", "answer": "two"}])
    with pytest.raises(SpecdraftError, match="line 1 of .*bad.jsonl is not a GSM8K record: it needs a `question`"):
        task_set_records(f"gsm8k:{bad}")
    with pytest.raises(SpecdraftError, match="GSM8K file not found"):
        task_set_records(f"gsm8k:{tmp_path / 'missing.jsonl'}")
    with pytest.raises(SpecdraftError, match="asks for items 0..5 of a set of 1 items"):
        task_set_records(f"gsm8k:{path}:5")


@pytest.mark.skipif(not SHARED_GSM8K.is_dir(), reason="../shared/data/gsm8k is not here")
def test_gsm8k_train_and_test_share_no_question_and_every_record_reads():
    train = task_set_records(f"gsm8k:{SHARED_GSM8K / 'train.jsonl'}")
    test = task_set_records(f"gsm8k:{SHARED_GSM8K / 'test.jsonl'}")
    assert (len(train), len(test)) == (7473, 1319)
    assert not {item["prompt"] for item in train} & {item["prompt"] for item in test}
    assert all(isinstance(item["answer"], (int, float)) for item in train + test)


@pytest.mark.parametrize("spec, message", [
    ("humaneval:dev", "unknown HumanEval split 'dev'; valid: train, heldout"),
    ("humaneval:train:lots", "write humaneval:SPLIT:COUNT with a positive integer COUNT, or "
                             "humaneval:SPLIT:START..END"),
    ("humaneval:heldout:60..70", "asks for items 60..70 of a set of 64 items"),
    ("tasks:train:0", "write tasks:SPLIT:COUNT with a positive integer COUNT, or tasks:SPLIT:START..END"),
    ("gsm8k:data/test.json", "write gsm8k:FILE[:RANGE] with FILE a .jsonl of GSM8K records"),
    ("gsm8k:data/test.jsonl:3..1", "write gsm8k:FILE:COUNT with a positive integer COUNT"),
])
def test_bad_specs_are_one_line_naming_the_forms(spec, message):
    with pytest.raises(SpecdraftError) as err:
        load_conversations([spec])
    assert message in str(err.value) and "\n" not in str(err.value)


def test_an_unknown_prompt_file_names_every_task_set_form():
    with pytest.raises(SpecdraftError) as err:
        list(source_records("prompts.txt"))
    assert "tasks:SPLIT[:RANGE], humaneval:SPLIT[:RANGE], gsm8k:FILE[:RANGE]" in str(err.value)


def test_the_template_suite_reads_as_before():
    assert task_set_records("tasks:heldout:3..5") == task_set_records("tasks:heldout:5")[3:]
    assert len(task_set_records("tasks:train")) == 500
    train = {item["prompt"] for item in task_set_records("tasks:train:2000")}
    assert not train & {item["prompt"] for item in task_set_records("tasks:heldout:2000")}
