"""Train -> export -> eval on a tiny random target, resume after a crash, bad inputs; what each command prints
(its result as JSON on stdout alone) and the files it writes (readable by others, as any file the user writes).
CPU, seconds each."""
import json
import os
import stat

import lightning as L
import pytest
import torch
from safetensors.torch import load_file

from specdraft import cli
from specdraft.recipes import load_recipe
from specdraft.train import trainer as trainer_module
from specdraft.train.timing import read_step_times
from specdraft.train.trainer import run_train
from tests.distilled import write_distilled


def make_recipe(tmp_path, target_dir, distill_dir, **train):
    prompts = tmp_path / "eval.jsonl"
    prompts.write_text("".join(json.dumps({"turns": [f"question {i}?"]}) + "\n" for i in range(3)))
    train_yaml = ", ".join(f"{k}: {v}" for k, v in {"output_dir": tmp_path / "run", "max_steps": 20,
                                                      "micro_batch_size": 4, "val_every_steps": 10, "lr": 3.0e-3,
                                                      "warmup_steps": 2, "log_every_steps": 5, **train}.items())
    path = tmp_path / "recipe.yaml"
    path.write_text(f"""
target: {{path: {target_dir}}}
method: {{name: eagle3, ttt_steps: 3, draft_vocab_size: 256}}
data: {{val_fraction: 0.2}}
distill: {{output_dir: {distill_dir}}}
train: {{{train_yaml}}}
eval: {{prompts: {prompts}, max_new_tokens: 24, depth: 3}}
""")
    return path


def test_train_export_eval(tmp_path, tiny_target_dir, distilled, capsys):
    recipe_path = make_recipe(tmp_path, tiny_target_dir, distilled)
    assert cli.main(["train", str(recipe_path)]) == 0
    run = tmp_path / "run"
    assert (run / "recipe.yaml").is_file() and (run / "checkpoints" / "last.ckpt").is_file()
    meta = json.loads((run / "best" / "meta.json").read_text())
    assert meta["metrics"]["val/tau_sim"] >= 1.0 and "val/acc@1" in meta["metrics"]
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["steps"] == 20 and summary["tokens"] == 20 * 4 * 32  # steps x micro-batch x row length
    steps = read_step_times(run / "logs" / "step_times.csv")
    assert [(step, tokens) for step, _, tokens in steps] == [(s, s * 4 * 32) for s in (5, 10, 15, 20)]
    assert summary["steady_tokens_per_s"] > 0
    for fmt in ("hf", "speculators"):
        assert cli.main(["export", str(run), "--format", fmt, "--out", str(tmp_path / fmt)]) == 0
        config = json.loads((tmp_path / fmt / "config.json").read_text())
        assert config["draft_vocab_size"] == 256
        assert "embed_tokens.weight" not in load_file(tmp_path / fmt / "model.safetensors")
    readable = 0o666 & ~current_umask()
    for written in (run / "best" / "draft.safetensors", tmp_path / "hf" / "model.safetensors",
                    tmp_path / "hf" / "config.json"):
        assert stat.S_IMODE(written.stat().st_mode) == readable, written  # 0644 under umask 022, as the rest
    capsys.readouterr()
    assert cli.main(["eval", str(tmp_path / "hf"), "--out", str(tmp_path / "ev")]) == 0
    printed = capsys.readouterr()
    assert json.loads(printed.out)["tau"] >= 1.0  # `specdraft eval EXPORT | jq .tau`: stdout is the JSON alone
    assert "tau=" in printed.err and "lossless=True" in printed.err  # the person's line, on stderr
    report = json.loads((tmp_path / "ev" / "eval.json").read_text())
    assert report["lossless"] is True and report["prompts"] == 3
    assert report["tau"] >= 1.0 and len(report["acceptance_by_position"]) == 3
    assert (tmp_path / "ev" / "eval.png").stat().st_size > 0
    assert sum(report["accepted_histogram"]) == report["cycles"]
    assert cli.main(["eval", str(run), "--out", str(tmp_path / "ev_run"), "eval.max_prompts=1"]) == 0
    assert json.loads((tmp_path / "ev_run" / "eval.json").read_text())["settings"]["draft"].endswith(
        "best/draft.safetensors")


class _Crash(L.Callback):
    """A crash after step 11, past step 10's validation and the checkpoint that follows it."""

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == 11:
            raise RuntimeError("simulated crash")


def test_resume_after_crash_matches_uninterrupted(tmp_path, tiny_target_dir, distilled, monkeypatch, caplog):
    (tmp_path / "a").mkdir()
    straight = make_recipe(tmp_path / "a", tiny_target_dir, distilled)
    run_train(load_recipe(straight))
    build = trainer_module.build_trainer

    def crashing(*args):
        trainer = build(*args)
        trainer.callbacks.append(_Crash())
        return trainer

    (tmp_path / "b").mkdir()
    resumed = make_recipe(tmp_path / "b", tiny_target_dir, distilled, resume="auto")
    monkeypatch.setattr(trainer_module, "build_trainer", crashing)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_train(load_recipe(resumed))
    monkeypatch.setattr(trainer_module, "build_trainer", build)
    with caplog.at_level("INFO", logger="specdraft.train.trainer"):
        run_train(load_recipe(resumed))
    assert "last.ckpt at step 10: draft weights, AdamW state (full state, saved at world size 1, loaded at " \
           "world size 1), LR schedule, data position (global sample 40) and RNG restored" in caplog.text
    weights_a = load_file(tmp_path / "a" / "run" / "last" / "draft.safetensors")
    weights_b = load_file(tmp_path / "b" / "run" / "last" / "draft.safetensors")
    for name in weights_a:
        torch.testing.assert_close(weights_a[name], weights_b[name], rtol=1e-5, atol=1e-6, msg=name)


def current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_the_speculators_export_names_its_verifier(tmp_path, tiny_target_dir, distilled, caplog):
    """vLLM loads the verifier by the name in speculators_config.verifier: --verifier's, else the target's path
    with a warning that says how to name it (a local target names no hub id)."""
    recipe_path = make_recipe(tmp_path, tiny_target_dir, distilled, max_steps=2, val_every_steps=2)
    assert cli.main(["train", str(recipe_path)]) == 0
    with caplog.at_level("WARNING"):
        assert cli.main(["export", str(tmp_path / "run"), "--format", "speculators", "--out", str(tmp_path / "a")]) == 0
    verifier = json.loads((tmp_path / "a" / "config.json").read_text())["speculators_config"]["verifier"]
    assert verifier["name_or_path"] == str(tiny_target_dir) and "--verifier HUB_ID" in caplog.text
    assert cli.main(["export", str(tmp_path / "run"), "--format", "speculators", "--out", str(tmp_path / "b"),
                     "--verifier", "HuggingFaceTB/SmolLM2-135M-Instruct"]) == 0
    config = json.loads((tmp_path / "b" / "config.json").read_text())
    assert config["speculators_config"]["verifier"]["name_or_path"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert config["specdraft"]["target_hub_id"] == "HuggingFaceTB/SmolLM2-135M-Instruct"


@pytest.mark.parametrize("argv, message", [
    (["export", "{tmp}/nowhere", "--out", "{tmp}/x"], "nowhere does not exist"),
    pytest.param(["train", "{recipe}", "train.strategy=deepspeed_stage_2"], "needs CUDA GPUs",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only check")),
    (["train", "{recipe}", "distill.output_dir={tmp}/empty"], "no distilled dataset"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, tiny_target_dir, distilled, capsys, argv, message):
    recipe_path = make_recipe(tmp_path, tiny_target_dir, distilled, max_steps=2, val_every_steps=2)
    if "{run}" in argv:
        assert cli.main(["train", str(recipe_path)]) == 0
    capsys.readouterr()
    argv = [a.format(run=tmp_path / "run", tmp=tmp_path, recipe=recipe_path) for a in argv]
    assert cli.main(argv) == 2
    err_lines = capsys.readouterr().err.strip().splitlines()
    assert message in err_lines[-1] and err_lines[-1].startswith("specdraft: error: ")
    assert sum("error" in line for line in err_lines) == 1
    assert not (tmp_path / "x").exists()


def test_corrupt_safetensors_is_a_clean_error(tmp_path, tiny_target_dir, distilled, capsys):
    recipe_path = make_recipe(tmp_path, tiny_target_dir, distilled, max_steps=2, val_every_steps=2)
    assert cli.main(["train", str(recipe_path)]) == 0
    (tmp_path / "run" / "best" / "draft.safetensors").write_bytes(b"\x00garbage")
    capsys.readouterr()
    assert cli.main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "x")]) == 2
    assert "corrupt safetensors file" in capsys.readouterr().err


def test_extra_distilled_sets_train_together(tmp_path, tiny_target_dir, distilled):
    from specdraft.train.data import load_distilled

    second = write_distilled(tmp_path / "second", tiny_target_dir, num_rows=5)
    assert len(load_distilled([str(distilled), str(second)])) == 12 + 5
    recipe_path = make_recipe(tmp_path, tiny_target_dir, distilled, max_steps=2, val_every_steps=2,
                          extra_distilled=f"[{second}]")
    summary = run_train(load_recipe(recipe_path))
    assert summary["train_rows"] + summary["val_rows"] == 17
