"""The coder campaign suite, tools/bench/coder.py, on a tiny target and a smaller model of its tokenizer, CPU, float32:
distill, train and export an EAGLE-3 head, then bench it and the draft model on three tiny prompt sets at two
temperatures against plain decoding, float32-checked; a second call skips every stage; --status tables what is done;
another method's export (--exports) benches beside them, the sets it was not benched on benched again."""
import json

import pytest

from specdraft.testing.tiny import save_tiny_target
from tools.bench import coder as suite

pytestmark = pytest.mark.usefixtures("one_thread")


def _lines(path, records):
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


@pytest.fixture
def campaign(tmp_path, tiny_target_dir):
    small = save_tiny_target(tmp_path / "small", seed=3, layers=1)
    train_prompts = _lines(tmp_path / "train.jsonl", [{"prompt": f"question {i}?"} for i in range(6)])
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"""
target: {{path: {tiny_target_dir}}}
method: {{name: eagle3, ttt_steps: 2, draft_vocab_size: 128}}
data: {{prompts: [{train_prompts}], val_fraction: 0.2}}
distill: {{output_dir: {tmp_path / 'unused'}, max_new_tokens: 12, batch_size: 3, shard_size: 3}}
train: {{output_dir: {tmp_path / 'unused_train'}, max_steps: 2, micro_batch_size: 2, val_every_steps: 2,
         warmup_steps: 1, log_every_steps: 1, lr: 3.0e-3}}
""")
    mt_bench = _lines(tmp_path / "mt_bench.jsonl", [{"category": "writing", "turns": ["Write a poem.", "More."]},
                                                    {"category": "coding", "turns": ["Sort a list."]}])
    humaneval = _lines(tmp_path / "humaneval.jsonl", [{"prompt": "def add(a, b):\n"}])
    spec_bench = tmp_path / "spec_bench"
    spec_bench.mkdir()
    _lines(spec_bench / "spec_bench_translation.jsonl", [{"category": "translation", "turns": ["Bonjour?"]}])
    args = [str(recipe), "--work", str(tmp_path / "work"), "--sets", "mt_bench:2", "humaneval", "translation:1",
            "--mt-bench", str(mt_bench), "--humaneval", str(humaneval), "--spec-bench", str(spec_bench),
            "--draft-model", str(small), "--variants", "eagle3,chain=true,depth=3", "draft_model_chain,depth=3",
            "--temperatures", "0", "1", "--max-new-tokens", "6", "--lossless-prompts", "1", "--device", "cpu",
            "--dtype", "float32", "--max-len", "256", "--max-prompts", "5"]
    return tmp_path / "work", args


def test_the_campaign_trains_benches_and_resumes_stage_by_stage(campaign, capsys):
    work, args = campaign
    report = suite.main(args)
    assert (work / "data" / "counts.json").is_file() and (work / "export" / "config.json").is_file()
    assert report["distill"]["conversations"] == 5 and report["train"]["steps"] == 2  # --max-prompts 5
    keys = {(row["variant"], row["category"], row["temperature"]) for row in report["rows"]}
    variants, sets = ["eagle3,chain=true,depth=3", "draft_model_chain,depth=3"], ["mt_bench", "humaneval", "translation"]
    assert keys == {(v, s, t) for v in variants for s in sets for t in (0.0, 1.0)} and not report["errors"]
    for row in report["rows"]:
        assert row["tau"] >= 1.0 and row["tokens_per_s"] > 0 and row["tokens_per_s_plain"] > 0
        assert row["prompts"] == {"mt_bench": 2, "humaneval": 1, "translation": 1}[row["category"]]
        checked = row["temperature"] == 0 and row["category"] in ("mt_bench", "humaneval")
        assert (row["float32_identical"], row["float32_prompts"]) == ((1, 1) if checked else (None, None))
        if row["temperature"] == 0:
            assert row["same_as_plain"] == row["prompts"]  # lossless in float32
    assert [(c["category"], c["temperature"]) for c in report["comparison"]] == \
        [(s, t) for t in (0.0, 1.0) for s in sets]
    assert all(c["draft_model_variant"] == variants[1] and c["over_draft_model"] > 0 for c in report["comparison"])
    assert json.loads((work / "coder.json").read_text()) == report
    out = capsys.readouterr().out
    assert "| eagle3,chain=true,depth=3 | mt_bench | 0 | 2 |" in out and "| × the draft model |" in out
    log = (work / "progress.log").read_text()
    assert "distill: done in" in log and "bench translation T=1: done in" in log

    again = suite.main(args)  # every stage's output is there: nothing runs again
    log = (work / "progress.log").read_text()
    assert all(f"{stage}: done before, skipped" in log for stage in ("distill", "train", "export"))
    assert log.count("done before, skipped") == 3 + 3 * 2
    assert again["rows"] == report["rows"]

    capsys.readouterr()
    shown = suite.main([*args, "--status"])
    out = capsys.readouterr().out
    assert "not running" in out and "suite done" in out and "| draft_model_chain,depth=3 | humaneval | 1 | 1 |" in out
    assert shown["rows"] == report["rows"] and not shown["missing"]

    variants = ["eagle3,chain=true,depth=3", "head,depth=3,topk=2,budget=5", "draft_model_chain,depth=3"]
    at = args.index("--variants")
    more = [*args[:at], "--exports", f"head={work / 'export'}", "--variants", *variants, *args[at + 3:]]
    at = more.index("--sets")
    more[at:at + 4] = ["--sets", "humaneval"]
    at = more.index("--temperatures")
    more[at:at + 3] = ["--temperatures", "0"]
    third = suite.main(more)
    log = (work / "progress.log").read_text().split("suite started")[-1]
    assert "train: done before, skipped" in log and "bench humaneval T=0: started" in log
    assert {row["variant"] for row in third["rows"]} == set(variants) and not third["errors"]
    head = next(row for row in third["rows"] if row["variant"] == variants[1])
    assert head["same_as_plain"] == head["prompts"] == 1 and (head["float32_identical"], head["float32_prompts"]) == (1, 1)
    assert [c["variant"] for c in third["comparison"]] == variants[:2] and third["exports"]["head"] == str(work / "export")


def test_train_only_stops_after_the_export_without_the_draft_model(campaign, tmp_path):
    work, args = campaign
    at = args.index("--draft-model")
    args[at + 1] = str(tmp_path / "not_there_yet")
    report = suite.main([*args, "--train-only"])
    assert report["export"] == str(work / "export") and (work / "export" / "config.json").is_file()
    assert not (work / "bench").exists() and "stopped after export" in (work / "progress.log").read_text()


def test_addons_train_after_the_head_on_its_data_and_bench_beside_it(campaign, tmp_path):
    """A PosS draft warm-started from the suite's EAGLE-3 export and trained on the head's conversations ({data},
    {export}): its own train and export under WORK/poss, no distill of its own, benched as the variant `poss`."""
    work, args = campaign
    addon = tmp_path / "poss.yaml"
    recipe = (tmp_path / "recipe.yaml").read_text()
    addon.write_text(recipe.replace("{name: eagle3, ttt_steps: 2, draft_vocab_size: 128}",
                                    "{name: poss, ttt_steps: 3, draft_vocab_size: 128, num_specialists: 2, "
                                    "positions_per_specialist: 2}"))
    at = args.index("--variants")
    more = [*args[:at], "--addons", f"poss={addon},distill.output_dir={{data}},method.init_from={{export}}",
            "--variants", "eagle3,chain=true,depth=3", "poss,chain=true,depth=3", *args[at + 3:]]
    at = more.index("--sets")
    more[at:at + 4] = ["--sets", "humaneval"]
    at = more.index("--temperatures")
    more[at:at + 3] = ["--temperatures", "0"]
    report = suite.main(more)
    assert (work / "poss" / "export" / "config.json").is_file() and not (work / "poss" / "data").exists()
    log = (work / "progress.log").read_text()
    assert "poss distill: done before, skipped" in log and "poss train: done in" in log
    poss = next(row for row in report["rows"] if row["variant"] == "poss,chain=true,depth=3")
    assert poss["same_as_plain"] == poss["prompts"] == 1 and report["exports"]["poss"] == str(work / "poss" / "export")


def test_bad_addons_are_named():
    for text in ("eagle3=r.yaml", "poss", "poss=r.yaml,notakeyvalue"):
        with pytest.raises(SystemExit, match="--addons"):
            suite.parse_addons([text])
    with pytest.raises(SystemExit, match="each once"):
        suite.parse_addons(["a=r.yaml", "a=s.yaml"])


def test_detach_starts_the_same_command_in_its_own_session(campaign, monkeypatch):
    work, args = campaign
    started = {}

    class Recorded:
        pid = 4321

        def __init__(self, command, **options):
            started.update(command=command, **options)

    monkeypatch.setattr(suite.subprocess, "Popen", Recorded)
    suite.main([*args, "--detach"])
    assert started["command"][1:3] == ["-m", "tools.bench.coder"] and "--detach" not in started["command"]
    assert started["command"][3:] == args and started["start_new_session"] is True
    assert (work / "coder.pid").read_text().strip() == "4321" and (work / "coder.log").is_file()


def test_bad_sets_and_variants_are_named():
    with pytest.raises(SystemExit, match="--sets 'mmlu'"):
        suite.parse_sets(["mmlu"])
    with pytest.raises(SystemExit, match="--sets 'humaneval:0'"):
        suite.parse_sets(["humaneval:0"])
    assert suite.parse_sets(["humaneval:20", "qa"]) == [("humaneval", 20), ("qa", None)]
    with pytest.raises(SystemExit, match="'depht=3' is not FIELD=VALUE"):
        suite.parse_variant("draft_model_chain,depht=3")
    assert suite.parse_variant("draft_model_tree,topk=4") == ("draft_model_tree,topk=4", True, {"topk": 4})
    with pytest.raises(SystemExit, match="--variants 'poss': NAME"):
        suite.parse_variant("poss")
    assert suite.parse_variant("poss,depth=5", ["poss"]) == ("poss,depth=5", False, {"depth": 5})
    assert suite.parse_exports(["poss=runs/p"]) == {"poss": suite.Path("runs/p")}
    for bad in ("eagle3=runs/e", "poss", "=runs/p"):
        with pytest.raises(SystemExit, match=f"--exports '{bad}'"):
            suite.parse_exports([bad])
