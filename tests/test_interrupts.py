"""Ctrl-C (a KeyboardInterrupt, monkeypatched into the work) during `distill-data`, `train` and `bench`: one line
saying what was kept and how to go on, exit 130, no traceback, nothing half-written; the same command (train:
with train.resume=auto) then finishes from there. Also the bad paths and prompt files that must fail before a model
loads. CPU, tiny random models."""
import json
import signal

import pytest

import specdraft.distill.run as distill
from specdraft import cli
from specdraft.decoding.engine import SpecEngine
from specdraft.data.format import read_counts, shards_dir
from specdraft.train.module import DraftModule
from tests.runtime.test_cli import export_dir  # noqa: F401  (a fixture: a tiny trained draft, exported)
from tests.test_train_export_eval import make_recipe


def interrupt_on_call(original, call: int):
    """`original`, raising KeyboardInterrupt (as Ctrl-C does) on its `call`-th call instead of running."""
    calls = []

    def wrapped(*args, **kwargs):
        calls.append(1)
        if len(calls) == call:
            raise KeyboardInterrupt
        return original(*args, **kwargs)

    return wrapped


def the_one_line(err: str, command: str) -> str:
    """stderr's last line, checked to be the interrupt's line and the only one (no traceback)."""
    lines = [line for line in err.split("\n") if line.strip()]
    assert "Traceback" not in err and sum("interrupted" in line for line in lines) == 1, err[-2000:]
    assert lines[-1].startswith(f"specdraft {command}: interrupted: "), err[-2000:]
    return lines[-1]


def no_temporaries(root) -> list:
    return [str(p) for p in root.rglob(".tmp-*")]


def distill_recipe(tmp_path, target_dir):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"question {i}?"}) + "\n" for i in range(6)))
    path = tmp_path / "recipe.yaml"
    path.write_text(f"target: {{path: {target_dir}}}\nmethod: {{name: eagle3}}\n"
                    f"data: {{prompts: [{prompts}], max_length: 256}}\n"
                    f"distill: {{output_dir: {tmp_path / 'data'}, max_new_tokens: 4, batch_size: 2, shard_size: 2}}\n")
    return path


def test_an_interrupted_distill_keeps_its_shards_and_resumes(tmp_path, tiny_target_dir, monkeypatch, capsys):
    recipe = distill_recipe(tmp_path, tiny_target_dir)
    real = distill.distill_shard
    monkeypatch.setattr(distill, "distill_shard", interrupt_on_call(real, 2))
    assert cli.main(["distill-data", str(recipe)]) == 130
    line = the_one_line(capsys.readouterr().err, "distill-data")
    out = tmp_path / "data"
    assert f"1 of its 3 shards written in {shards_dir(out)}" in line and "run the same command again" in line
    assert sorted(p.name for p in shards_dir(out).iterdir()) == ["shard-00000"] and not no_temporaries(out)
    shard_calls = []
    monkeypatch.setattr(distill, "distill_shard", lambda ctx, dialogs, index: shard_calls.append(index) or
                        real(ctx, dialogs, index))
    assert cli.main(["distill-data", str(recipe)]) == 0
    assert shard_calls == [1, 2]  # the kept shard is not distilled again
    counts = read_counts(out)
    assert counts["input"] == 6 == counts["ok"] + counts["error"] + counts["skipped"]


def test_an_interrupted_train_keeps_its_checkpoint_and_resumes(tmp_path, tiny_target_dir, distilled, monkeypatch,
                                                                capsys, caplog):
    recipe = make_recipe(tmp_path, tiny_target_dir, distilled, max_steps=20, val_every_steps=10)
    step = DraftModule.training_step

    def ctrl_c_at_step_14(self, batch, batch_idx):
        if self.trainer.global_step == 14:
            raise KeyboardInterrupt
        return step(self, batch, batch_idx)

    monkeypatch.setattr(DraftModule, "training_step", ctrl_c_at_step_14)
    handler = signal.getsignal(signal.SIGINT)
    assert cli.main(["train", str(recipe)]) == 130
    assert signal.getsignal(signal.SIGINT) is handler  # Lightning leaves SIGINT ignored; the trainer puts it back
    line = the_one_line(capsys.readouterr().err, "train")
    run = tmp_path / "run"
    assert "train stopped at step 14; kept its checkpoint of step 10" in line
    assert "add train.resume=auto to the same command to resume from step 10" in line
    assert (run / "checkpoints" / "last.ckpt").is_file() and not (run / "train_summary.json").exists()
    assert json.loads((run / "last" / "meta.json").read_text())["step"] == 10 and not no_temporaries(run)
    monkeypatch.setattr(DraftModule, "training_step", step)
    with caplog.at_level("INFO", logger="specdraft.train.trainer"):
        assert cli.main(["train", str(recipe), "train.resume=auto"]) == 0
    assert "last.ckpt at step 10" in caplog.text
    assert json.loads((run / "train_summary.json").read_text())["steps"] == 20


def test_a_train_interrupted_before_its_first_checkpoint_says_nothing_was_kept(tmp_path, tiny_target_dir, distilled,
                                                                               monkeypatch, capsys):
    recipe = make_recipe(tmp_path, tiny_target_dir, distilled, max_steps=4, val_every_steps=4)
    monkeypatch.setattr(DraftModule, "training_step", interrupt_on_call(DraftModule.training_step, 2))
    assert cli.main(["train", str(recipe)]) == 130
    line = the_one_line(capsys.readouterr().err, "train")
    assert "before its first checkpoint (step 4): nothing kept to resume from; run the same command again" in line


BENCH = ["--max-new-tokens", "6", "--device", "cpu", "--max-len", "256", "--chain", "--depth", "2", "--temperature",
         "0", "--no-hf", "--lossless-prompts", "0"]


def test_an_interrupted_bench_writes_nothing_and_runs_again(export_dir, monkeypatch, capsys):
    prompts = export_dir.parent / "eval.jsonl"  # 3 prompts: the 3rd generate is the 2nd timed prompt
    generate = SpecEngine.generate
    monkeypatch.setattr(SpecEngine, "generate", interrupt_on_call(generate, 3))
    assert cli.main(["bench", str(export_dir), "--prompts", str(prompts), *BENCH]) == 130
    line = the_one_line(capsys.readouterr().err, "bench")  # the progress bar's line ended before it
    assert f"nothing written to {export_dir}" in line and "run the same command again" in line
    assert not (export_dir / "bench.json").exists() and not no_temporaries(export_dir)
    monkeypatch.setattr(SpecEngine, "generate", generate)
    assert cli.main(["bench", str(export_dir), "--prompts", str(prompts), *BENCH]) == 0
    assert (export_dir / "bench.json").is_file() and (export_dir / "bench.png").is_file()  # beside the export


def test_an_empty_prompt_file_fails_before_the_model_loads(export_dir, tmp_path, monkeypatch, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")

    def no_loading(*args, **kwargs):
        raise AssertionError("the runtime was loaded")

    monkeypatch.setattr("specdraft.runtime.load.load_runtime", no_loading)
    assert cli.main(["bench", str(export_dir), "--prompts", str(empty), *BENCH]) == 2
    assert "no prompts in" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["export", "--out", "{tmp}/x"], ["eval"], ["generate", "--prompt", "hi"],
                                     ["bench"]])
def test_a_missing_directory_does_not_exist(tmp_path, capsys, command):
    argv = [command[0], str(tmp_path / "nowhere"), *[a.format(tmp=tmp_path) for a in command[1:]]]
    assert cli.main(argv) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("specdraft: error: ") and "nowhere does not exist" in error[0]


def test_an_interrupt_anywhere_else_is_one_line_too(export_dir, monkeypatch, capsys):
    monkeypatch.setattr("specdraft.eval.run.load_target", interrupt_on_call(None, 1))
    assert cli.main(["eval", str(export_dir), "eval.device=cpu"]) == 130
    line = the_one_line(capsys.readouterr().err, "eval")
    assert "nothing is half-written" in line and "run the same command again" in line
