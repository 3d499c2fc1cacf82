"""The judge suite, tools/bench/judge.py, on a tiny target beside a tiny EAGLE-3 draft (CPU, about a minute: slow):
labels mined on checked prompts, the head trained and exported, the δ sweep benched on held-out prompts against
exact and plain decoding; its table and JSON; a second, on-policy round beside the first."""
import json
import zlib

import pytest

from specdraft.data import checks
from tests.addons import train_base_export, write_prompts
from tools.bench import judge as suite


@pytest.mark.slow
def test_the_suite_mines_trains_and_sweeps_delta(tmp_path, monkeypatch, tiny_target_dir, distilled, capsys):
    monkeypatch.setenv("SPECDRAFT_KERNELS", "reference")
    solved = set()

    def first_then_parity(check, answer):  # each prompt's own answer passes; branches pass by their length's parity
        if check.expected not in solved:
            solved.add(check.expected)
            return True
        return len(answer) % 2 == 0

    monkeypatch.setitem(checks.CHECKS, "parity", first_then_parity)
    base = train_base_export(tmp_path / "base", tiny_target_dir, distilled)
    train = write_prompts(tmp_path / "train.jsonl", [{"prompt": f"q{i}?", "check": "parity", "answer": i}
                                                     for i in range(4)])
    heldout = write_prompts(tmp_path / "heldout.jsonl", [{"prompt": f"h{i}?", "check": "parity", "answer": -1}
                                                         for i in range(2)])
    second_set = write_prompts(tmp_path / "second.jsonl", [{"prompt": f"s{i}?", "check": "parity", "answer": -1}
                                                           for i in range(3)])
    report = suite.main([str(base), "data.val_fraction=0.25", "data.max_length=256", "train.max_steps=3",
                         "train.val_every_steps=3", "train.micro_batch_size=2", "train.warmup_steps=1",
                         "--target", str(tiny_target_dir), "--train-prompts", str(train), "--heldout-prompts",
                         str(heldout), str(second_set), "--thresholds", "0.9", "0", "--precision-targets", "0.5",
                         "--max-new-tokens", "8", "--shape", "3", "2,2,4", "--lossless-prompts", "1", "--work",
                         str(tmp_path / "work")])
    labels = report["labels"]
    assert labels["prompts"] == labels["labelled_prompts"] == 4 and labels["labels"] > 0
    assert labels["positives"] + labels["negatives"] == labels["labels"] and labels["check_errors"] == 0
    heldout = report["heldout_labels"]
    chosen = heldout["threshold_for_precision"]["0.5"]
    assert heldout["labels"] > 0 and [point["threshold"] for point in heldout["curve"]] == sorted({0.0, 0.9, chosen})
    bench = report["bench"]
    assert not any(run["lossless"] for run in bench["judge_sweep"]) and bench["float32_check"]["identical"] == 1
    assert bench["settings"]["dtype"] == "float32"
    sweep = [run["judge_threshold"] for run in bench["judge_sweep"]]
    assert sweep == sorted({0.0, 0.9, *([chosen] if chosen < 1 else [])})
    assert bench["judge_sweep"][0]["tau"] == 4.0  # δ = 0 accepts the whole chain
    other = report["other_shapes"]["2,2,4"]  # the same head on a tree
    assert other["exact_tau"] >= 1.0 and [point["judge_threshold"] for point in other["sweep"]] == sweep
    assert other["sweep"][0]["tau_ratio"] >= 1.0
    assert json.loads((tmp_path / "work" / "judge.json").read_text())["labels"] == labels
    out = capsys.readouterr().out
    assert "| exact |" in out and "| δ=0 | 4.00 |" in out and "goal (retained accuracy >= 98%)" in out
    assert "target and draft in float32" in out and "held-out labels:" in out
    assert "| 2,2,4 |" in out and "δ=0.9: τ ratio / retained" in out
    first_set = tmp_path / "heldout.jsonl"
    first, second = report["heldout_sets"]["sets"]  # each set benched at the first shape, then pooled
    assert (first["prompts"], first["count"]) == (str(first_set), 2)
    assert (second["prompts"], second["count"]) == (str(second_set), 3)
    assert first["exact_tau"] == report["bench"]["runs"][0]["tau"]
    assert json.loads((tmp_path / "work" / "bench-set2" / "bench.json").read_text())["runs"][0]["prompts"] == 3
    pooled = report["heldout_sets"]["pooled"]
    assert pooled["prompts"] == 5 and [point["judge_threshold"] for point in pooled["sweep"]] == sweep
    assert pooled["sweep"][0]["tau"] == 4.0 and f"| {second_set} | 3 |" in out and "| pooled | 5 |" in out
    resumed = suite.main([str(base), "data.val_fraction=0.25", "data.max_length=256", "train.max_steps=3",
                          "train.val_every_steps=3", "train.micro_batch_size=2", "train.warmup_steps=1",
                          "--target", str(tiny_target_dir), "--train-prompts", str(train), "--heldout-prompts",
                          str(first_set), str(second_set), "--thresholds", "0.9", "0", "--precision-targets", "0.5",
                          "--max-new-tokens", "8", "--shape", "3", "2,2,4", "--work", str(tmp_path / "work"),
                          "--resume"])
    assert resumed["bench"] == bench and resumed["stage_seconds"]["bench set 2"] == 0.0  # kept, not run again
    assert "train" not in resumed["stage_seconds"]  # the export is kept: the benches' head


def test_overrides_typed_after_the_shapes_stay_overrides(tmp_path):
    args = suite._args([str(tmp_path), "a=1", "--shape", "5,8,40", "6", "train.max_steps=3"])
    assert args.shape == ["5,8,40", "6"] and args.overrides == ["a=1", "train.max_steps=3"]
    args = suite._args([str(tmp_path), "--heldout-prompts", "humaneval:heldout", "tasks:heldout:100", "b=2",
                        "--train-prompts", "humaneval:train", "gsm8k:train.jsonl:0..5", "c=3"])
    assert args.heldout_prompts == ["humaneval:heldout", "tasks:heldout:100"] and args.overrides == ["b=2", "c=3"]
    assert args.train_prompts == ["humaneval:train", "gsm8k:train.jsonl:0..5"]
    assert "data.prompts=[humaneval:train,gsm8k:train.jsonl:0..5]" in suite.round_overrides(args, tmp_path, 1)
    default = suite._args([str(tmp_path)])
    assert default.train_prompts is None and default.heldout_prompts == ["tasks:heldout:100"]
    assert not any(o.startswith("data.prompts") for o in suite.round_overrides(default, tmp_path, 1))
    assert suite.training_prompts(default) == ["tasks:train:4000"]  # the recipe's own


def test_a_held_out_prompt_that_is_a_training_prompt_stops_the_suite(tmp_path):
    assert suite.shared_prompt(["humaneval:train", "tasks:train:300"], ["humaneval:heldout", "tasks:heldout:300"]) \
        is None
    assert suite.shared_prompt(["humaneval:train:0..10"], ["humaneval:heldout", "humaneval:train:9..12"]) == \
        "humaneval:train:9..12 item 0"
    with pytest.raises(SystemExit, match="held-out prompt humaneval:train:1 item 0 is also a training prompt"):
        suite.main([str(tmp_path), "--train-prompts", "humaneval:train:2", "--heldout-prompts", "humaneval:train:1",
                    "--work", str(tmp_path / "work")])


def _run(tau: float, cycles: int, solved_plain: int, solved_both: int, prompts: int, threshold=None) -> dict:
    run = {"temperature": 0.0, "tau": tau, "cycles": cycles, "prompts": prompts,
           "new_tokens": {"spec": tau * cycles, "plain": tau * cycles},
           "seconds": {"spec": cycles, "plain": tau * cycles},
           "answers": {"solved_plain": solved_plain, "solved_both": solved_both,
                       "retained_accuracy": solved_both / solved_plain, "accuracy_plain": solved_plain / prompts}}
    return run if threshold is None else {**run, "judge_threshold": threshold}


def test_sets_pool_their_cycles_and_the_prompts_plain_decoding_solves():
    one = {"runs": [_run(2.0, 100, 10, 10, 20)], "judge_sweep": [_run(3.0, 50, 10, 10, 20, 0.9)]}
    two = {"runs": [_run(4.0, 300, 30, 30, 40)], "judge_sweep": [_run(5.0, 100, 30, 28, 40, 0.9)]}
    pooled = suite.pooled([one, two])
    assert pooled["exact_tau"] == pytest.approx((2 * 100 + 4 * 300) / 400) and pooled["prompts"] == 60
    point = pooled["sweep"][0]
    assert point["tau"] == pytest.approx((3 * 50 + 5 * 100) / 150) and point["retained_accuracy"] == 38 / 40
    assert point["tau_ratio"] == pytest.approx(point["tau"] / pooled["exact_tau"]) and pooled["goal"] is None
    kept = suite.pooled([one, {**two, "judge_sweep": [_run(5.0, 100, 30, 30, 40, 0.9)]}])
    assert kept["goal"]["judge_threshold"] == 0.9 and kept["goal"]["retained_accuracy"] == 1.0


@pytest.mark.slow
def test_a_second_round_mines_with_the_first_round_s_judge_and_reports_both(tmp_path, monkeypatch, tiny_target_dir,
                                                                              distilled, capsys):
    monkeypatch.setenv("SPECDRAFT_KERNELS", "reference")
    monkeypatch.setitem(checks.CHECKS, "hashed", lambda check, answer: zlib.crc32(answer.encode()) % 3 != 0)
    base = train_base_export(tmp_path / "base", tiny_target_dir, distilled)
    train = write_prompts(tmp_path / "train.jsonl", [{"prompt": f"q{i}?", "check": "hashed", "answer": i}
                                                     for i in range(6)])
    heldout = write_prompts(tmp_path / "heldout.jsonl", [{"prompt": f"h{i}?", "check": "hashed", "answer": -1}
                                                         for i in range(2)])
    heldout_labels = write_prompts(tmp_path / "heldout_labels.jsonl",
                                   [{"prompt": f"t{i}?", "check": "hashed", "answer": i} for i in range(4)])
    work = tmp_path / "work"
    report = suite.main([
        str(base), "data.val_fraction=0.25", "data.max_length=256", "train.max_steps=3", "train.val_every_steps=3",
        "train.micro_batch_size=2", "train.warmup_steps=1", "--target", str(tiny_target_dir), "--train-prompts",
        str(train), "--heldout-prompts", str(heldout), "--thresholds", "0.9", "0", "--precision-targets", "0.5",
        "--max-new-tokens", "8", "--shape", "3", "--lossless-prompts", "1", "--rounds", "2", "--mine-threshold", "0",
        "--template-labels", str(heldout_labels), "--work", str(work)])
    first, second = report["rounds"]
    assert first["round"] == 1 and first["mine_judge"] is None and first["labels"] == report["labels"]
    assert second["mine_judge"] == str(work / "export") and second["mine_threshold"] == 0.0
    assert second["labels"]["prompts"] == 6 and second["labels"]["unrecoverable"] is not None
    round1_sweep = [point["judge_threshold"] for point in first["sweep"]]
    assert set(round1_sweep) <= {point["judge_threshold"] for point in second["sweep"]}
    recipe = (work / "round2" / "train" / "recipe.yaml").read_text()
    assert str(work / "labels") in recipe and str(work / "round2" / "labels") in recipe  # both rounds' labels
    assert (work / "round2" / "export" / "config.json").is_file()
    templates = report["template_labels"]  # mined once, with exact acceptance; every round's head scored on them
    assert templates["mined"]["prompts"] == 4 and templates["labels"] == templates["mined"]["labels"]
    assert (work / "template_labels.json").is_file() and (work / "round2" / "template_labels.json").is_file()
    assert all("template_precision" in point for point in second["sweep"])
    out = capsys.readouterr().out
    assert "round 2, mined with" in out and "label precision / template-label precision" in out
    assert f"labels mined on {heldout_labels}:" in out
