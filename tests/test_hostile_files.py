"""Hostile and broken files, built here: each is refused with one line naming the file (exit 2), runs no code
(a target whose auto_map module writes a marker file; a pickle whose payload would) and writes nothing (the
directories it touches hash the same before and after). CPU, tiny random targets, seconds each."""
import errno
import hashlib
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.trainer.states import TrainerFn
from safetensors.torch import load_file, save_file

from specdraft import cli
from specdraft.train import manifest
from specdraft.train.resharding import ReshardingDeepSpeedStrategy
from tests.test_train_export_eval import make_recipe

pytestmark = pytest.mark.reference_kernels

PAYLOAD = '''
import pathlib
pathlib.Path({marker!r}).write_text("ran")
from transformers import LlamaConfig, LlamaForCausalLM


class PayloadConfig(LlamaConfig):
    model_type = {model_type!r}


class PayloadModel(LlamaForCausalLM):
    config_class = PayloadConfig
'''


class Payload:
    """Pickled, it asks the loader to run code that writes `marker`."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('ran')",)


def tree(path: Path) -> dict:
    """{relative path: sha256} of every file under `path` ({} when it does not exist)."""
    if not path.exists():
        return {}
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


def one_line_error(capsys, argv, *fragments) -> str:
    """Run the CLI: exit 2, exactly one `specdraft: error:` line holding every fragment, no traceback."""
    capsys.readouterr()
    assert cli.main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("specdraft: error: ")]
    assert len(errors) == 1 and "Traceback" not in err, err[-2000:]
    for fragment in fragments:
        assert str(fragment) in errors[0], errors[0]
    return errors[0]


def payload_target(directory: Path, tiny_target_dir: Path, marker: Path, model_type: str = "llama") -> Path:
    """The tiny target plus Python of its own: an auto_map to payload.py, which writes `marker` when imported."""
    shutil.copytree(tiny_target_dir, directory)
    config = json.loads((directory / "config.json").read_text())
    config.update(model_type=model_type, auto_map={"AutoConfig": "payload.PayloadConfig",
                                                   "AutoModelForCausalLM": "payload.PayloadModel"})
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "payload.py").write_text(PAYLOAD.format(marker=str(marker), model_type=model_type))
    return directory


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_target_dir, distilled):
    """A 2-step run (checkpoints/last.ckpt, best/, last/) and its hf export, made once."""
    base = tmp_path_factory.mktemp("hostile_run")
    recipe = make_recipe(base, tiny_target_dir, distilled, max_steps=2, val_every_steps=2)
    assert cli.main(["train", str(recipe)]) == 0
    assert cli.main(["export", str(base / "run"), "--out", str(base / "export")]) == 0
    return base


def copy_export(trained, tmp_path) -> Path:
    return Path(shutil.copytree(trained / "export", tmp_path / "export"))


def copy_run(trained, tmp_path, tiny_target_dir, distilled, **train) -> Path:
    """A copy of the trained run and a recipe that resumes it."""
    shutil.copytree(trained / "run", tmp_path / "run")
    return make_recipe(tmp_path, tiny_target_dir, distilled, max_steps=4, val_every_steps=2, resume="auto", **train)


def edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


# --- code from elsewhere ---------------------------------------------------------------------------------------------

def point_export_at(export: Path, target: Path) -> None:
    """What the issue found: an export whose files name a target with code of its own and ask to trust it."""
    def edit(config):
        config["specdraft"]["target_config"].update(path=str(target), trust_remote_code=True)
        config["specdraft"]["target"] = str(target)
    edit_json(export / "config.json", edit)
    text = (export / "recipe.yaml").read_text()
    (export / "recipe.yaml").write_text(text.replace("trust_remote_code: false", "trust_remote_code: true"))


GENERATE = ["--prompt", "hi", "--max-new-tokens", "4", "--device", "cpu"]


def test_export_asking_for_remote_code_runs_none(tmp_path, trained, tiny_target_dir, capsys, caplog):
    marker = tmp_path / "MARKER"
    export = copy_export(trained, tmp_path)
    point_export_at(export, payload_target(tmp_path / "target", tiny_target_dir, marker))
    assert cli.main(["generate", str(export), *GENERATE]) == 0  # transformers' own Llama: the payload never ran
    assert not marker.exists()
    assert "the code that target" in caplog.text and "will not run" in caplog.text
    assert cli.main(["generate", str(export), *GENERATE, "--trust-remote-code"]) == 0
    assert marker.read_text() == "ran"  # the flag, and only the flag, runs it
    assert f"--trust-remote-code: the Python code that target {tmp_path / 'target'} ships" in caplog.text


def test_target_needing_its_code_is_refused_without_the_flag(tmp_path, trained, tiny_target_dir, capsys):
    marker = tmp_path / "MARKER"
    export = copy_export(trained, tmp_path)
    point_export_at(export, payload_target(tmp_path / "target", tiny_target_dir, marker, model_type="payload_llama"))
    before = tree(export)
    one_line_error(capsys, ["generate", export, *GENERATE], "ships its own Python code", "--trust-remote-code")
    one_line_error(capsys, ["eval", export, "--out", tmp_path / "ev", "eval.max_prompts=1"], "--trust-remote-code")
    assert not marker.exists() and tree(export) == before and not (tmp_path / "ev").exists()


def test_recipe_asking_for_remote_code_warns_and_needs_the_flag(tmp_path, tiny_target_dir, distilled, capsys,
                                                                caplog):
    marker = tmp_path / "MARKER"
    target = payload_target(tmp_path / "target", tiny_target_dir, marker, model_type="payload_llama")
    recipe = make_recipe(tmp_path, target, distilled, max_steps=2, val_every_steps=2)
    recipe.write_text(recipe.read_text().replace(f"path: {target}}}", f"path: {target}, trust_remote_code: true}}"))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "hello"}\n')
    for command in (["distill-data", recipe, f"data.prompts=[{prompts}]", f"distill.output_dir={tmp_path / 'd'}"],
                    ["train", recipe]):
        one_line_error(capsys, command, str(target), "--trust-remote-code")
    assert f"sets target.trust_remote_code: true; the code that target {target} ships will not run" in caplog.text
    assert not marker.exists() and not (tmp_path / "d").exists() and not (tmp_path / "run").exists()


# --- checkpoints -----------------------------------------------------------------------------------------------------

def test_truncated_last_ckpt(tmp_path, trained, tiny_target_dir, distilled, capsys):
    recipe = copy_run(trained, tmp_path, tiny_target_dir, distilled)
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    last.write_bytes(last.read_bytes()[:1000])
    before = tree(tmp_path / "run")
    one_line_error(capsys, ["train", recipe], f"corrupt checkpoint {last}", "train.resume=PATH")
    assert tree(tmp_path / "run") == before


def test_checkpoint_pickle_is_refused(tmp_path, trained, tiny_target_dir, distilled, capsys):
    recipe = copy_run(trained, tmp_path, tiny_target_dir, distilled)
    marker, last = tmp_path / "MARKER", tmp_path / "run" / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, weights_only=True)
    torch.save({**checkpoint, "callbacks": Payload(marker)}, last)
    before = tree(tmp_path / "run")
    one_line_error(capsys, ["train", recipe], f"refusing checkpoint {last}", "GLOBAL", "weights_only=True")
    assert not marker.exists() and tree(tmp_path / "run") == before


def test_checkpoint_of_another_draft_names_the_tensor(tmp_path, trained, tiny_target_dir, distilled, capsys):
    """A checkpoint whose recipe is this one's, but whose weights are another draft's (a changed recipe is refused
    before: tests/test_resume.py)."""
    recipe = copy_run(trained, tmp_path, tiny_target_dir, distilled)
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, weights_only=True)
    name = next(key for key in checkpoint["state_dict"] if key.startswith("draft."))
    checkpoint["state_dict"][name] = torch.zeros(3, 5)
    torch.save(checkpoint, last)
    before = tree(tmp_path / "run")
    one_line_error(capsys, ["train", recipe], "last.ckpt does not fit", f"tensor {name} has shape [3, 5]",
                   "the draft's is [")
    assert tree(tmp_path / "run") == before


def test_resumed_run_counts_the_whole_run_and_does_not_warn(tmp_path, trained, tiny_target_dir, distilled, recwarn):
    recipe = copy_run(trained, tmp_path, tiny_target_dir, distilled)
    assert cli.main(["train", str(recipe)]) == 0
    summary = json.loads((tmp_path / "run" / "train_summary.json").read_text())
    assert summary["steps"] == 4 and summary["tokens"] == 4 * 4 * 32  # steps x micro-batch x row length
    assert not [w for w in recwarn if "not resumable" in str(w.message)]


def fake_deepspeed_checkpoint(path: Path, marker: Path) -> Path:
    """A DeepSpeed-layout checkpoint whose model states would run a payload when unpickled."""
    (path / "checkpoint").mkdir(parents=True)
    (path / "latest").write_text("checkpoint")
    torch.save({"dp_world_size": 1, "ds_config": {}, "payload": Payload(marker)},
               path / "checkpoint" / "mp_rank_00_model_states.pt")
    return path


def test_deepspeed_checkpoint_needs_this_users_signature(tmp_path, monkeypatch):
    monkeypatch.setenv(manifest.KEY_ENV, str(tmp_path / "key"))  # a fresh key: made at the first signature
    checkpoint = fake_deepspeed_checkpoint(tmp_path / "last.ckpt", tmp_path / "MARKER")
    assert "has no specdraft-manifest.json" in manifest.refusal(checkpoint, trust=False)
    manifest.sign_checkpoint(checkpoint)
    assert manifest.refusal(checkpoint, trust=False) is None and (tmp_path / "key").stat().st_mode & 0o077 == 0
    (checkpoint / "checkpoint" / "extra_optim_states.pt").write_bytes(b"planted")
    assert "checkpoint/extra_optim_states.pt was added, removed or changed" in manifest.refusal(checkpoint, False)
    manifest.sign_checkpoint(checkpoint)
    monkeypatch.setenv(manifest.KEY_ENV, str(tmp_path / "another_users_key"))
    assert "not signed with this user's key" in manifest.refusal(checkpoint, trust=False)
    assert manifest.refusal(checkpoint, trust=True) is None
    assert not (tmp_path / "MARKER").exists()


def test_deepspeed_resume_unpickles_nothing_unsigned(tmp_path):
    """The strategy checks the manifest before DeepSpeed's pickles are read; the flag is what lets them be."""
    marker = tmp_path / "MARKER"
    checkpoint = fake_deepspeed_checkpoint(tmp_path / "last.ckpt", marker)
    fitting = SimpleNamespace(state=SimpleNamespace(fn=TrainerFn.FITTING))
    strategy = ReshardingDeepSpeedStrategy(stage=2, resume_from=str(checkpoint))
    with pytest.raises(cli.SpecdraftError, match="refusing to resume DeepSpeed checkpoint .*--trust-checkpoint"):
        strategy.setup(fitting)
    assert not marker.exists()
    trusting = ReshardingDeepSpeedStrategy(stage=2, resume_from=str(checkpoint), trust_checkpoint=True)
    with pytest.raises(Exception):  # the fake holds no real engine state; its payload ran first
        trusting.setup(fitting)
    assert marker.read_text() == "ran"


@pytest.mark.gpu
def test_deepspeed_run_signs_its_checkpoint_and_refuses_a_changed_one(tmp_path, tiny_target_dir, distilled, capsys):
    """Through Lightning on a GPU: the save signs, the resume checks, a changed file is refused, the flag resumes."""
    recipe = make_recipe(tmp_path, tiny_target_dir, distilled, max_steps=2, val_every_steps=2, resume="auto",
                         strategy="deepspeed_stage_2")
    assert cli.main(["train", str(recipe)]) == 0
    checkpoint = tmp_path / "run" / "checkpoints" / "last.ckpt"
    assert manifest.refusal(checkpoint, trust=False) is None
    assert cli.main(["train", str(recipe), "train.max_steps=4"]) == 0  # its own checkpoint: resumed
    states = next(checkpoint.rglob("*model_states.pt"))
    states.write_bytes(states.read_bytes() + b"appended")
    one_line_error(capsys, ["train", recipe, "train.max_steps=6"], "refusing to resume DeepSpeed checkpoint",
                   "model_states.pt was added, removed or changed", "--trust-checkpoint")
    assert cli.main(["train", str(recipe), "train.max_steps=6", "--trust-checkpoint"]) == 0
    assert json.loads((tmp_path / "run" / "train_summary.json").read_text())["steps"] == 6


# --- corrupt inputs --------------------------------------------------------------------------------------------------

BOMB = "".join(f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]\n" for prev, name in zip("abcdefg", "bcdefgh"))


@pytest.mark.parametrize("text, message", [
    ("target: {path: x\nmethod: [\n", "cannot parse recipe"),
    ("a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + BOMB, "YAML node expansion exceeds"),
    ("- a list\n", "expected a mapping of sections"),
])
def test_broken_recipe(tmp_path, capsys, text, message):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(text)
    one_line_error(capsys, ["train", recipe], str(recipe), message)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["recipe.yaml"]


@pytest.mark.parametrize("name, content, message", [
    ("deep.jsonl", b"[" * 100_000 + b"\n", "RecursionError"),
    ("garbled.jsonl.gz", b"\x1f\x8b\x08\x00garbage", "corrupt prompt file"),
    ("bad.json", b'[{"prompt": "a"},', "cannot parse JSON"),
])
def test_broken_prompt_set(tmp_path, tiny_target_dir, distilled, capsys, name, content, message):
    prompts = tmp_path / name
    prompts.write_bytes(content)
    recipe = make_recipe(tmp_path, tiny_target_dir, distilled)
    one_line_error(capsys, ["distill-data", recipe, f"data.prompts=[{prompts}]", f"distill.output_dir={tmp_path}/d"],
                   str(prompts), message)
    assert not (tmp_path / "d").exists()


def test_truncated_arrow_in_train(tmp_path, tiny_target_dir, distilled, capsys):
    data = Path(shutil.copytree(distilled, tmp_path / "data"))
    arrow = next((data / "dataset").glob("*.arrow"))
    arrow.write_bytes(arrow.read_bytes()[:600])
    recipe = make_recipe(tmp_path, tiny_target_dir, data)
    one_line_error(capsys, ["train", recipe], f"corrupt distilled dataset {arrow}", "--merge")
    assert not (tmp_path / "run").exists()


@pytest.fixture(scope="module")
def shards(tmp_path_factory, tiny_target_dir):
    """A distill-data output of three shards (five prompts, two a shard) on the tiny target, made once."""
    base = tmp_path_factory.mktemp("hostile_shards")
    recipe = distill_recipe(base, tiny_target_dir, base / "out")
    (base / "prompts.jsonl").write_text("".join(json.dumps({"prompt": f"question {i}"}) + "\n" for i in range(5)))
    assert cli.main(["distill-data", str(recipe)]) == 0
    return base


def distill_recipe(base: Path, target: Path, out: Path) -> Path:
    recipe = base / f"distill-{out.name}.yaml"
    recipe.write_text(f"target: {{path: {target}}}\nmethod: {{name: eagle3}}\n"
                      f"data: {{prompts: [{base / 'prompts.jsonl'}], max_length: 256}}\n"
                      f"distill: {{output_dir: {out}, max_new_tokens: 6, batch_size: 2, shard_size: 2}}\n")
    return recipe


def write_ids(out: Path) -> list:
    return [json.loads(p.read_text())["write_id"] for p in sorted((out / "shards").glob("shard-*/counts.json"))]


def test_corrupt_shard_names_itself_and_is_redone_alone(tmp_path, shards, tiny_target_dir, capsys):
    out = Path(shutil.copytree(shards / "out", tmp_path / "out"))
    recipe = distill_recipe(shards, tiny_target_dir, out)
    ids = write_ids(out)
    arrow = next((out / "shards" / "shard-00001").glob("*.arrow"))
    arrow.write_bytes(arrow.read_bytes()[:400])
    shutil.rmtree(out / "dataset")  # a merge is due
    before = tree(out)
    one_line_error(capsys, ["distill-data", recipe, "--merge"], f"corrupt shard {arrow}",
                   f"delete {out / 'shards' / 'shard-00001'} and run `specdraft distill-data`")
    assert tree(out) == before
    shutil.rmtree(out / "shards" / "shard-00001")  # what the message says
    assert cli.main(["distill-data", str(recipe)]) == 0
    again = write_ids(out)
    assert again[0] == ids[0] and again[2] == ids[2] and again[1] != ids[1]  # that shard alone was rewritten
    assert json.loads((out / "counts.json").read_text()) == {"input": 5, "ok": 5, "error": 0, "skipped": 0}


def test_full_disk_during_the_merge(tmp_path, shards, tiny_target_dir, capsys, monkeypatch):
    from datasets import Dataset

    out = Path(shutil.copytree(shards / "out", tmp_path / "out"))
    shutil.rmtree(out / "dataset")
    before = tree(out)

    def full_disk(self, directory, **kwargs):
        (Path(directory) / "data-00000-of-00001.arrow").write_bytes(b"half a file")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Dataset, "save_to_disk", full_disk)
    one_line_error(capsys, ["distill-data", distill_recipe(shards, tiny_target_dir, out), "--merge"],
                   f"cannot write {out / 'dataset'}: No space left on device", "nothing was written")
    assert tree(out) == before and not list(out.glob(".tmp-*"))


def _nest(config):
    config["specdraft"]["runtime"] = json.loads("[" * 50 + "]" * 50)


@pytest.mark.parametrize("edit, message", [
    (lambda path: path.write_text(path.read_text()[:200]), "corrupt export config"),
    (lambda path: path.write_text('{"specdraft": ' + "[" * 100_000), "RecursionError"),
    (lambda path: edit_json(path, lambda c: c["specdraft"].update(target_info=[1, 2])), "corrupt export config"),
    (lambda path: edit_json(path, lambda c: c["specdraft"].update(method_config={"no_such": 1})),
     "corrupt export config"),
    (lambda path: edit_json(path, lambda c: c["specdraft"].update(method="no_such")), "unknown method"),
    (lambda path: edit_json(path, lambda c: c["specdraft"].update(base="../../elsewhere")), "names base"),
])
def test_malformed_export_config(tmp_path, trained, capsys, edit, message):
    export = copy_export(trained, tmp_path)
    edit(export / "config.json")
    one_line_error(capsys, ["generate", export, *GENERATE], export / "config.json", message)


def test_wrongly_shaped_tensor_is_named(tmp_path, trained, capsys):
    export = copy_export(trained, tmp_path)
    tensors = load_file(export / "model.safetensors")
    tensors["fc.weight"] = torch.zeros(3, 5)
    save_file(tensors, str(export / "model.safetensors"))
    one_line_error(capsys, ["generate", export, *GENERATE], export / "model.safetensors", "fc.weight",
                   "torch.Size([3, 5])")


# --- what errors show, and files too large or too hostile to read --------------------------------------------------

SECRET = "root:x:0:0:secret-password-hash:/root:/bin/bash"


def test_an_error_never_prints_another_files_contents(tmp_path, trained, capsys):
    """An export whose recipe.yaml links to a private file: the error names the file and the problem only."""
    export = copy_export(trained, tmp_path)
    secret = tmp_path / "shadow"
    secret.write_text("".join(f"{SECRET}{i}\n" for i in range(20)))
    (export / "recipe.yaml").unlink()
    (export / "recipe.yaml").symlink_to(secret)
    line = one_line_error(capsys, ["eval", export, "--out", tmp_path / "ev"], "unknown recipe section",
                          export / "recipe.yaml")
    assert "secret" not in line and "root:x" not in line
    (tmp_path / "r.yaml").write_text(f"method: {{name: eagle3}}\ntrain: {{max_steps: '{SECRET}'}}\n")
    line = one_line_error(capsys, ["train", tmp_path / "r.yaml"], "bad value for train.max_steps", "expected int")
    assert "secret" not in line
    (tmp_path / "r.yaml").write_text(f"method: {{name: '{SECRET}'}}\n")
    assert "secret" not in one_line_error(capsys, ["train", tmp_path / "r.yaml"], "unknown method")


def test_an_oversized_prompt_is_refused_before_tokenizing(tmp_path, trained, capsys, monkeypatch):
    from specdraft.data.sources import MAX_CONVERSATION_CHARS

    prompts = tmp_path / "huge.jsonl"
    prompts.write_text(json.dumps({"prompt": "a" * (MAX_CONVERSATION_CHARS + 1)}) + "\n")
    monkeypatch.setattr("specdraft.runtime.load.load_runtime", lambda *a, **k: pytest.fail("the runtime loaded"))
    one_line_error(capsys, ["bench", copy_export(trained, tmp_path), "--prompts", prompts, *GENERATE[2:]],
                   f"record 0 of {prompts} holds {MAX_CONVERSATION_CHARS + 1:,} characters", "cut it")


def test_a_pickled_weights_file_in_the_target_is_refused_in_one_line(tmp_path, trained, tiny_target_dir, capsys):
    marker = tmp_path / "MARKER"
    target = Path(shutil.copytree(tiny_target_dir, tmp_path / "target"))
    (target / "model.safetensors").unlink()
    torch.save({"model.embed_tokens.weight": Payload(marker)}, target / "pytorch_model.bin")
    export = copy_export(trained, tmp_path)
    one_line_error(capsys, ["generate", export, "--target", target, *GENERATE], "refusing the weights of target",
                   "GLOBAL")
    assert not marker.exists()


def test_an_exports_runtime_settings_of_the_wrong_type(tmp_path, trained, capsys):
    export = copy_export(trained, tmp_path)
    edit_json(export / "config.json", lambda config: config["specdraft"]["runtime"].update(topk="many"))
    one_line_error(capsys, ["generate", export, *GENERATE], export / "config.json", "topk is of type str",
                   "expected Optional[int]")


def test_a_corrupt_throughput_record_names_itself(tmp_path, shards, tiny_target_dir, capsys):
    out = Path(shutil.copytree(shards / "out", tmp_path / "out"))
    shutil.rmtree(out / "dataset")  # a merge is due
    record = next((out / "throughput").glob("worker-*.json"))
    record.write_text('{"worker": 0, "dev')
    before = tree(out)
    one_line_error(capsys, ["distill-data", distill_recipe(shards, tiny_target_dir, out), "--merge"],
                   f"corrupt throughput record {record}", "delete it and run")
    assert tree(out) == before
