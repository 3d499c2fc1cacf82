"""Long contexts: the long-context prompt sets (tools/long_prompts.py) built from a small copy of ../shared/data's
layout, under a byte tokenizer; `specdraft bench`'s τ by prompt-length bucket. CPU."""
import json
import random

import pytest

from specdraft.runtime.bench import context_bucket, tau_by_context
from tests.tiny import byte_tokenizer
from tools import long_prompts

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma".split()


def _text(rng, words):
    return " ".join(rng.choice(WORDS) for _ in range(words))


@pytest.fixture
def shared(tmp_path):
    """Spec-Bench's question.jsonl (summarization, RAG, one MT-bench item) and the two ShareGPT files."""
    rng = random.Random(0)
    records = [{"question_id": i, "category": "summarization", "turns": [f"Summarize: {_text(rng, 60)}"]}
               for i in range(6)]
    records += [{"question_id": 100 + i, "category": "rag", "turns": [f"{_text(rng, 50)}\n{_text(rng, 40)}\nWhy {i}?"]}
                for i in range(6)]
    records.append({"question_id": 200, "category": "writing", "turns": ["Write a poem."]})
    (tmp_path / "spec_bench").mkdir()
    (tmp_path / "spec_bench" / "question.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "sharegpt").mkdir()
    for rel in long_prompts.SHAREGPT:
        people = [{"id": str(i), "conversations": [{"from": "human", "value": f"Please {_text(rng, 15)}"}]}
                  for i in range(8)]
        (tmp_path / rel).write_text(json.dumps(people))
    return tmp_path


def test_long_prompts_have_their_lengths_and_end_on_a_question(shared):
    tokenizer = byte_tokenizer()
    documents = long_prompts.load_documents(shared)
    assert {d.kind for d in documents} == {"article", "passages", "request"} and len(documents) == 6 + 6 + 16
    rows = long_prompts.build_prompts(documents, 6, 1500, 2500, seed=3, tokenizer=tokenizer)
    measure = long_prompts.tokens_of(tokenizer).prompt
    for row in rows:
        text = row["messages"][0]["content"]
        assert 1500 <= row["token_length"] <= 2500 and row["token_length"] == measure(text)
        assert row["asks_about"] in row["documents"] and len(set(row["documents"])) == len(row["documents"])
        asked = row["documents"].index(row["asks_about"]) + 1
        question = text.rpartition("Question: ")[2]
        assert f"document {asked}" in question
        document = next(d for d in documents if d.origin == row["asks_about"])
        assert document.text in text  # the document asked about is whole
        if document.kind == "passages":
            assert question.endswith("?")
    assert rows == long_prompts.build_prompts(documents, 6, 1500, 2500, seed=3, tokenizer=tokenizer)  # deterministic
    assert rows != long_prompts.build_prompts(documents, 6, 1500, 2500, seed=4, tokenizer=tokenizer)


def test_prepare_prompts_writes_both_sets(shared, tmp_path, tiny_target_dir):
    long_path, short_path = long_prompts.write_long_sets(shared, tmp_path / "out", 3, 0, str(tiny_target_dir),
                                                         long_tokens=(1200, 1800), short_tokens=(300, 500))
    long_rows = [json.loads(line) for line in long_path.read_text().splitlines()]
    short_rows = [json.loads(line) for line in short_path.read_text().splitlines()]
    assert len(long_rows) == len(short_rows) == 3
    assert all(1200 <= r["token_length"] <= 1800 for r in long_rows)
    assert all(300 <= r["token_length"] <= 500 for r in short_rows)
    from specdraft.runtime.answers import bench_prompts

    turns, _, _ = bench_prompts(str(long_path), None)  # the bench reads the set
    assert turns == [r["messages"][0]["content"] for r in long_rows]


@pytest.mark.parametrize("length, bucket", [(0, "<1K"), (1023, "<1K"), (1024, "1-2K"), (4095, "2-4K"),
                                            (4096, "4-8K"), (8191, "4-8K"), (8192, ">=8K"), (60000, ">=8K")])
def test_context_buckets(length, bucket):
    assert context_bucket(length) == bucket


def test_tau_by_context_weighs_cycles():
    per_prompt = [{"prompt_len": 900, "spec_cycles": 10, "spec_cycle_tokens": 30},
                  {"prompt_len": 5000, "spec_cycles": 20, "spec_cycle_tokens": 50},
                  {"prompt_len": 300, "spec_cycles": 5, "spec_cycle_tokens": 20},
                  {"prompt_len": 6000, "spec_cycles": 0, "spec_cycle_tokens": 0}]
    assert tau_by_context(per_prompt) == [{"bucket": "<1K", "prompts": 2, "cycles": 15, "tau": 50 / 15},
                                          {"bucket": "4-8K", "prompts": 2, "cycles": 20, "tau": 2.5}]
