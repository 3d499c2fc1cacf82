"""Long contexts: the long-context prompt sets (tools/long_prompts.py) built from a small copy of ../shared/data's
layout, under a byte tokenizer; `specdraft bench`'s τ by prompt-length bucket. CPU."""
import json
import random

import pytest

from specdraft.runtime.bench import context_bucket, tau_by_context
from specdraft.testing.tiny import byte_tokenizer
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


@pytest.mark.slow
def test_long_context_suite_trains_benches_and_measures_both_heads(shared, tmp_path, tiny_target_dir, distilled,
                                                                  capsys):
    """tools/bench/long_context.py on the tiny target, CPU: both heads trained two steps on the same rows,
    exported, benched on both prompt sets (lossless in float32) with τ by bucket, their cache bytes by context."""
    from tests.test_train_export_eval import make_recipe
    from tools.bench import long_context

    recipe = make_recipe(tmp_path, tiny_target_dir, distilled)
    report = long_context.main(["train.max_steps=2", "train.val_every_steps=2", "data.max_length=128",
                                "--recipe", str(recipe), "--data", str(distilled), "--work", str(tmp_path / "work"),
                                "--shared", str(shared), "--count", "2", "--long-tokens", "500", "800",
                                "--short-tokens", "250", "400", "--window", "16", "--sinks", "2", "--context", "1024",
                                "--max-new-tokens", "8", "--cache-lengths", "256", "1024"])
    assert report["prompt_tokens"] == {"1k": report["prompt_tokens"]["1k"], "long": report["prompt_tokens"]["long"]}
    assert 250 <= report["prompt_tokens"]["1k"][0] and report["prompt_tokens"]["long"][1] <= 800
    runs = {r["run"]: r for r in report["runs"]}
    assert set(runs) == {"full", "longspec"}
    for run in runs.values():
        assert run["train_steps"] == 2 and run["keeps"] is not None
        for bench in run["sets"].values():
            assert bench["lossless_float32"] is True and bench["tau"] >= 1.0 and bench["prompts"] == 2
            assert bench["tau_by_context"] and bench["tau_by_context"][0]["bucket"] == "<1K"
    assert runs["longspec"]["longspec_settings"] == ["attention_window: 16", "attention_sinks: 2",
                                                     "position_offset: 896"]
    assert runs["full"]["longspec_settings"] == []
    assert runs["longspec"]["constant_in_context"] is True and runs["full"]["constant_in_context"] is False
    full_bytes = runs["full"]["bytes_by_context"]
    assert full_bytes["1024"] > full_bytes["256"] > runs["longspec"]["bytes_by_context"]["1024"]
    assert json.loads((tmp_path / "work" / "long_context.json").read_text()) == json.loads(json.dumps(report))
    printed = capsys.readouterr().out
    assert "| longspec | attention_window: 16" in printed and "goal (longspec keeps" in printed


def _fake_run(run, steps, method, taus, cache):
    """A WORK/<run> as the suite's stages leave it: train summary and recipe, two bench reports, cache bytes."""
    (run / "train").mkdir(parents=True)
    (run / "train" / "train_summary.json").write_text(json.dumps({"steps": steps}))
    (run / "train" / "recipe.yaml").write_text("method:\n" + "".join(f"  {k}: {v}\n" for k, v in method.items()))
    for set_name, (tau, buckets) in taus.items():
        (run / f"bench-{set_name}").mkdir()
        greedy = {"prompts": 3, "tau_by_context": [{"bucket": b, "prompts": 3, "cycles": 9, "tau": t}
                                                   for b, t in buckets]}
        (run / f"bench-{set_name}" / "bench.json").write_text(json.dumps(
            {"tau": tau, "lossless_float32": True, "tokens_per_s": 10.0, "speedup_vs_plain": 1.5, "runs": [greedy]}))
    (run / "cache_bytes.json").write_text(json.dumps(cache))


def test_long_context_collect_reads_runs_and_judges_the_goal(tmp_path, capsys):
    """--collect over a WORK its stages filled: each head's τ on both sets, keeps = long τ / 1K τ, the settings it
    trained with (none for full attention), its cache bytes, and the goal line."""
    from tools.bench import long_context

    work = tmp_path / "work"
    (work / "prompts").mkdir(parents=True)
    for name, lengths in {"long_prompts.jsonl": [4100, 6900], "long_prompts_1k.jsonl": [800, 1000]}.items():
        (work / "prompts" / name).write_text("".join(json.dumps({"token_length": n}) + "\n" for n in lengths))
    _fake_run(work / "full", 5, {"attention_window": 0, "attention_sinks": 4, "position_offset": 0},
              {"1k": (3.0, [("<1K", 3.0)]), "long": (2.4, [("4-8K", 2.4)])},
              {"bytes_by_context": {"1024": 2 ** 20, "8192": 2 ** 23}, "constant_in_context": False})
    _fake_run(work / "longspec", 5, {"attention_window": 512, "attention_sinks": 4, "position_offset": 6144},
              {"1k": (2.9, [("<1K", 2.9)]), "long": (2.8, [("4-8K", 2.8)])},
              {"bytes_by_context": {"1024": 2 ** 19, "8192": 2 ** 19}, "constant_in_context": True})
    report = long_context.main(["--collect", "--work", str(work), "--cache-lengths", "1024", "8192",
                                "train.max_steps=5"])
    assert report["overrides"] == ["train.max_steps=5"] and report["cache_lengths"] == [1024, 8192]
    assert report["prompt_tokens"] == {"long": [4100, 6900], "1k": [800, 1000]}
    runs = {r["run"]: r for r in report["runs"]}
    assert runs["full"]["keeps"] == pytest.approx(0.8) and runs["longspec"]["keeps"] == pytest.approx(2.8 / 2.9)
    assert runs["full"]["longspec_settings"] == []
    assert runs["longspec"]["longspec_settings"] == ["attention_window: 512", "attention_sinks: 4",
                                                     "position_offset: 6144"]
    assert runs["longspec"]["sets"]["long"]["tau_by_context"] == [{"bucket": "4-8K", "prompts": 3, "cycles": 9,
                                                                   "tau": 2.8}]
    printed = capsys.readouterr().out
    assert "| full | full attention | 3.000 | 2.400 | 80.0 | 1k <1K 3.00; long 4-8K 2.40 |" in printed
    assert "| 1.00 / 8.00 |" in printed and "| 0.50 / 0.50 |" in printed
    assert "goal (longspec keeps >= 95% of its 1K τ, full less): met (longspec 96.6%, full 80.0%)" in printed
    assert json.loads((work / "long_context.json").read_text())["runs"] == json.loads(json.dumps(report["runs"]))


def test_long_context_goal_not_met_and_not_measured():
    from tools.bench.long_context import goal_line

    assert "NOT met" in goal_line([{"run": "full", "keeps": 0.97}, {"run": "longspec", "keeps": 0.96}])
    assert "NOT met" in goal_line([{"run": "full", "keeps": 0.5}, {"run": "longspec", "keeps": 0.9}])
    assert goal_line([{"run": "full", "keeps": None}, {"run": "longspec", "keeps": 0.99}]).startswith(
        "goal: not measured")


def test_long_context_resumes_at_the_stage_it_was_in(tmp_path, monkeypatch):
    """A second call runs only the stages whose output WORK lacks: here the longspec head's long-prompt bench."""
    from tools.bench import long_context

    work = tmp_path / "work"
    (work / "prompts").mkdir(parents=True)
    for name in long_context.SETS.values():
        (work / "prompts" / name).write_text(json.dumps({"token_length": 900}) + "\n")
    for name in long_context.RUNS:
        _fake_run(work / name, 5, {"attention_window": 0}, {"1k": (2.0, [("<1K", 2.0)]), "long": (2.0, [])},
                  {"bytes_by_context": {"1024": 1}, "constant_in_context": True})
        (work / name / "export.done").write_text("")
    (work / "longspec" / "bench-long" / "bench.json").unlink()
    calls = []
    monkeypatch.setattr(long_context, "specdraft_stage", calls.append)
    long_context.main(["--work", str(work), "--data", str(tmp_path / "data"), "--prompts", str(work / "prompts"),
                       "--cache-lengths", "1024"])
    assert [argv[:2] for argv in calls] == [["bench", str(work / "longspec" / "export")]]
    assert calls[0][calls[0].index("--prompts") + 1] == str(work / "prompts" / "long_prompts.jsonl")
    assert calls[0][calls[0].index("--out") + 1] == str(work / "longspec" / "bench-long")
