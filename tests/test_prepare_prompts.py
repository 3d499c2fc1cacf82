"""tools/prepare_prompts.py's code prompts: programming requests only, none that the training mix already holds; its
copy of GSM8K, which the judge recipes' gsm8k: task sets read."""
import json
import random

import pytest

from specdraft.data.task_sets import task_set_records
from tools.prepare_prompts import CODE_REQUEST, CODE_SOURCES, code_rows, copy_gsm8k


@pytest.mark.parametrize("text, code", [
    ("Write a function in Java to print the first 10 Fibonacci numbers.", True),
    ("How do I make an HTTP request in Javascript?", True),
    ("Here is my script:\n```\nls -la\n```\nwhy does it fail?", True),
    ("import numpy as np\nx = np.zeros(3)\nwhat is x?", True),
    ("Fix this query so that it returns every user.", True),
    ("Write a poem about the sea.", False),
    ("A zoo has 16 animals. How many legs are there?", False),
    ("Explain the causes of the French Revolution.", False),
])
def test_code_requests_are_told_apart(text, code):
    assert bool(CODE_REQUEST.search(text)) is code


def test_code_rows_take_programming_prompts_the_mix_leaves_out(tmp_path):
    texts = ["Write a python function that sorts a list.", "Write a poem about autumn.",
             "Debug this code: print(x", "What is the capital of France?"]
    for rel in CODE_SOURCES:
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        records = [{"prompt": text} for text in texts]
        path.write_text(json.dumps(records) if rel.endswith(".json") else  # .json: one list, .jsonl: lines
                        "".join(json.dumps(record) + "\n" for record in records))
    left_out = {f"{CODE_SOURCES[0]}#0"}
    rows = code_rows(tmp_path, left_out, 100, random.Random(0))
    origins = {row["origin"] for row in rows}
    assert origins == {f"{rel}#{i}" for rel in CODE_SOURCES for i in (0, 2)} - left_out
    assert all(row["messages"][0]["role"] == "user" and CODE_REQUEST.search(row["messages"][0]["content"])
               for row in rows)
    assert len(code_rows(tmp_path, left_out, 3, random.Random(0))) == 3


def test_gsm8k_is_copied_where_the_judge_recipes_read_it(tmp_path):
    shared = tmp_path / "shared"
    (shared / "gsm8k").mkdir(parents=True)
    for name, question in (("train.jsonl", "1 + 1?"), ("test.jsonl", "2 + 2?")):
        (shared / "gsm8k" / name).write_text(json.dumps({"question": question, "answer": "#### 2"}) + "\n")
        (shared / "gsm8k" / name).chmod(0o444)  # ../shared/data is read-only: the copy must still be rewritable
    for _ in range(2):
        folder = copy_gsm8k(shared, tmp_path / ".data")
    assert folder == tmp_path / ".data" / "gsm8k"
    assert [item["prompt"].split("\n")[0] for item in task_set_records(f"gsm8k:{folder / 'test.jsonl'}")] == ["2 + 2?"]
    assert task_set_records(f"gsm8k:{folder / 'train.jsonl'}")[0]["answer"] == 2
