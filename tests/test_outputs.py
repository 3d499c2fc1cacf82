"""Nothing a user had is lost: `export --out` writes only where an export may go, checkpoints and snapshots are
written whole or not at all (another filesystem's rename, a full disk, a kill in the middle), and what a killed
write left is finished or undone by the next run. Each refusal is one line, exit 2, no traceback. CPU, tiny random
target; the run and export are made once (tests/test_hostile_files.py's `trained`)."""
import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError

from specdraft import cli
from specdraft.core import io
from specdraft.core.errors import SpecdraftError
from specdraft.train import checkpoints
from tests.test_hostile_files import copy_export, copy_run, one_line_error, trained, tree  # noqa: F401 (fixture)

pytestmark = pytest.mark.reference_kernels


def dead_pid() -> int:
    """The pid of a process that has ended (what a kill -9 leaves in a temporary's name)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def dead_tag() -> str:
    return f"{io.host_id()}-{dead_pid()}-0123abcd"


# --- export --out ----------------------------------------------------------------------------------------------------

@pytest.fixture
def run_copy(tmp_path, trained):
    return Path(shutil.copytree(trained / "run", tmp_path / "run"))


@pytest.mark.parametrize("where", ["run", "run/best", "."])
@pytest.mark.parametrize("force", [[], ["--force"]])
def test_export_never_writes_into_the_run_it_reads(tmp_path, run_copy, capsys, where, force):
    before = tree(tmp_path)
    out = tmp_path / where
    one_line_error(capsys, ["export", run_copy, "--out", out, *force], f"--out {out}", "which this export reads",
                   "--force never replaces what is read")
    assert tree(tmp_path) == before


def test_export_refuses_a_directory_of_other_files(tmp_path, run_copy, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("my notes")
    one_line_error(capsys, ["export", run_copy, "--out", out], f"{out} already holds files that are not an export",
                   "--force")
    assert (out / "notes.txt").read_text() == "my notes"
    assert cli.main(["export", str(run_copy), "--out", str(out), "--force"]) == 0  # what --force is for
    assert (out / "config.json").is_file() and not (out / "notes.txt").exists()


@pytest.mark.parametrize("force", [[], ["--force"]])
def test_export_refuses_a_file(tmp_path, run_copy, capsys, force):
    out = tmp_path / "notes.txt"
    out.write_text("my notes")
    one_line_error(capsys, ["export", run_copy, "--out", out, *force], f"{out} is a file")
    assert out.read_text() == "my notes" and sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "run"]


def test_export_replaces_an_export_and_fills_an_empty_directory(tmp_path, run_copy, trained):
    out = copy_export(trained, tmp_path)
    (tmp_path / "empty").mkdir()
    for target in (out, tmp_path / "empty"):
        assert cli.main(["export", str(run_copy), "--out", str(target)]) == 0
        assert (target / "model.safetensors").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith((".tmp-", ".old-"))]


def test_an_export_exported_onto_itself_is_refused(tmp_path, trained, capsys):
    export = copy_export(trained, tmp_path)
    before = tree(export)
    one_line_error(capsys, ["export", export, "--out", export, "--force"], "which this export reads")
    assert tree(export) == before


def test_export_to_a_full_disk(tmp_path, run_copy, capsys, monkeypatch):
    """safetensors raises SafetensorError (not an OSError) for a full disk."""
    def full_disk(tensors, path, metadata=None):
        Path(path).write_bytes(b"half")
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr("specdraft.core.tensor_files.save_file", full_disk)
    out = tmp_path / "export"
    one_line_error(capsys, ["export", run_copy, "--out", out], f"cannot write {out}: No space left on device")
    assert not out.exists() and not list(tmp_path.glob(".tmp-*"))


# --- interrupted atomic writes ---------------------------------------------------------------------------------------

def test_a_killed_exports_temporary_is_removed_by_the_next_export(tmp_path, run_copy):
    leftover = tmp_path / f".tmp-export-{dead_tag()}"
    leftover.mkdir()
    (leftover / "model.safetensors").write_bytes(b"\0" * (1 << 20))
    live = tmp_path / f".tmp-export-{io.host_id()}-{os.getpid()}-89abcdef"  # a live writer's: left alone
    live.mkdir()
    assert cli.main(["export", str(run_copy), "--out", str(tmp_path / "export")]) == 0
    assert not leftover.exists() and live.is_dir()


def swap_killed_between_renames(final: Path, finished_write: bool) -> Path:
    """What a kill between atomic_dir's two renames leaves: `final` moved to .old-, the new one (when its write had
    finished) still at .tmp-."""
    tag = dead_tag()
    old = final.with_name(f".old-{final.name}-{tag}")
    os.replace(final, old)
    if finished_write:
        new = final.with_name(f".tmp-{final.name}-{tag}")
        new.mkdir()
        (new / "marker").write_text("new")
    return old


@pytest.mark.parametrize("finished_write, expected", [(True, "new"), (False, "old")])
def test_a_swap_killed_between_its_renames_is_finished_or_undone(tmp_path, finished_write, expected):
    final = tmp_path / "export"
    final.mkdir()
    (final / "marker").write_text("old")
    swap_killed_between_renames(final, finished_write)
    io.recover(final)
    assert (final / "marker").read_text() == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]


def test_an_older_versions_half_swap_is_undone(tmp_path):
    """specdraft's earlier atomic_dir named the replaced directory .old-NAME-PID."""
    old = tmp_path / f".old-best-{dead_pid()}"
    old.mkdir()
    (old / "marker").write_text("old")
    io.recover(tmp_path / "best")
    assert (tmp_path / "best" / "marker").read_text() == "old" and not old.exists()


def test_reading_an_export_whose_swap_was_killed_finishes_it(tmp_path, trained, capsys):
    export = copy_export(trained, tmp_path)
    swap_killed_between_renames(export, finished_write=False)
    assert cli.main(["generate", str(export), "--prompt", "hi", "--max-new-tokens", "2", "--device", "cpu"]) == 0
    assert (export / "config.json").is_file() and sorted(p.name for p in tmp_path.iterdir()) == ["export"]


def test_a_snapshot_swap_killed_in_a_run_is_undone_when_the_run_is_read(tmp_path, run_copy):
    swap_killed_between_renames(run_copy / "best", finished_write=False)
    assert cli.main(["export", str(run_copy), "--out", str(tmp_path / "export")]) == 0
    assert (run_copy / "best" / "draft.safetensors").is_file() and not list(run_copy.glob(".old-*"))


def test_a_refused_rename_leaves_the_directory_as_it_was(tmp_path, monkeypatch):
    final = tmp_path / "best"
    final.mkdir()
    (final / "marker").write_text("old")
    real = os.replace

    def cross_device(src, dst):  # the new directory's rename fails, after the old one was moved aside
        if Path(dst) == final and Path(src).name.startswith(".tmp-"):
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        return real(src, dst)

    monkeypatch.setattr(os, "replace", cross_device)
    with pytest.raises(SpecdraftError, match="cannot write .*best: Invalid cross-device link"):
        with io.atomic_dir(final) as tmp:
            (tmp / "marker").write_text("new")
    assert (final / "marker").read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["best"]


def test_a_write_on_a_read_only_disk_is_one_line_even_when_cleaning_up(tmp_path, monkeypatch):
    """atomic_file's cleanup of its temporary fails on a read-only disk too: the write's error is what is told."""
    def read_only(self, *args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(self))

    monkeypatch.setattr(Path, "unlink", read_only)
    monkeypatch.setattr(Path, "write_text", read_only)
    with pytest.raises(SpecdraftError, match="cannot write .*x.json: Read-only file system"):
        io.write_json(tmp_path / "x.json", {"a": 1})


# --- checkpoints -----------------------------------------------------------------------------------------------------

def test_a_checkpoint_renamed_across_filesystems_loses_nothing(tmp_path, trained, tiny_target_dir, distilled,
                                                              capsys, monkeypatch):
    recipe = copy_run(trained, tmp_path, tiny_target_dir, distilled)
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    before = last.read_bytes()
    real = os.replace

    def cross_device(src, dst):
        if Path(dst) == last:
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        return real(src, dst)

    monkeypatch.setattr(os, "replace", cross_device)
    one_line_error(capsys, ["train", recipe], f"cannot write {last}: Invalid cross-device link")
    assert last.read_bytes() == before and not list(last.parent.glob(".tmp-*"))


def test_a_full_disk_while_checkpointing_keeps_the_previous_checkpoint(tmp_path, trained, tiny_target_dir, distilled,
                                                                       capsys, monkeypatch):
    recipe = copy_run(trained, tmp_path, tiny_target_dir, distilled)
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    before = last.read_bytes()

    def full_disk(obj, handle):
        handle.write(b"half a checkpoint")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoints.torch, "save", full_disk)
    one_line_error(capsys, ["train", recipe], f"cannot write {last}: No space left on device")
    assert last.read_bytes() == before and not list(last.parent.glob(".tmp-*"))
    monkeypatch.undo()
    assert cli.main(["train", str(recipe)]) == 0  # and it resumes from it


def test_a_killed_saves_temporary_is_removed_by_the_next_save(tmp_path):
    last = tmp_path / "last.ckpt"
    leftover = tmp_path / f".tmp-last.ckpt-{dead_tag()}"
    leftover.write_bytes(b"\0" * 1000)
    checkpoints.AtomicCheckpointIO().save_checkpoint({"global_step": 3}, last)
    assert torch.load(last, weights_only=True) == {"global_step": 3} and not leftover.exists()


def test_a_deepspeed_checkpoint_is_swapped_in_whole(tmp_path, monkeypatch):
    """ReshardingDeepSpeedStrategy.save_checkpoint writes a new directory and swaps it in: a save the disk refuses
    leaves the previous checkpoint whole and signed (DeepSpeed's own writer stands in for the engine here)."""
    from lightning.pytorch.strategies import DeepSpeedStrategy

    from specdraft.train.manifest import refusal
    from specdraft.train.resharding import ReshardingDeepSpeedStrategy

    def engine_save(self, checkpoint, filepath, storage_options=None):
        (Path(filepath) / "checkpoint").mkdir(parents=True)
        (Path(filepath) / "latest").write_text("checkpoint")
        (Path(filepath) / "checkpoint" / "mp_rank_00_model_states.pt").write_text(str(checkpoint["global_step"]))

    monkeypatch.setattr(DeepSpeedStrategy, "save_checkpoint", engine_save)
    strategy, final = ReshardingDeepSpeedStrategy(stage=2), tmp_path / "last.ckpt"
    strategy.save_checkpoint({"global_step": 1}, final)
    states = final / "checkpoint" / "mp_rank_00_model_states.pt"
    assert states.read_text() == "1" and refusal(final, trust=False) is None
    real = os.replace

    def cross_device(src, dst):  # the new directory's rename fails, after the old one was moved aside
        if Path(dst) == final and Path(src).name.startswith(".tmp-"):
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        return real(src, dst)

    monkeypatch.setattr(os, "replace", cross_device)
    with pytest.raises(SpecdraftError, match="Invalid cross-device link"):
        strategy.save_checkpoint({"global_step": 2}, final)
    assert states.read_text() == "1" and refusal(final, trust=False) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]
    monkeypatch.setattr(os, "replace", real)
    strategy.save_checkpoint({"global_step": 3}, final)
    assert states.read_text() == "3" and refusal(final, trust=False) is None


# --- output directories -------------------------------------------------------------------------------------------

def test_train_refuses_a_directory_of_other_files(tmp_path, tiny_target_dir, distilled, capsys):
    from tests.test_train_export_eval import make_recipe

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "notes.txt").write_text("my notes")
    recipe = make_recipe(tmp_path, tiny_target_dir, distilled, max_steps=2, val_every_steps=2)
    one_line_error(capsys, ["train", recipe], f"{tmp_path / 'run'} already holds files that are not a training run")
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["notes.txt"]


def test_a_directory_holding_only_its_slurm_job_folder_is_claimed(tmp_path):
    """`specdraft slurm` writes the job's script and logs into OUTPUT/slurm before the job runs: the job's train or
    distill-data then claims OUTPUT; any other file still makes it foreign."""
    from specdraft.core.errors import SpecdraftError
    from specdraft.core.io import JOB_FOLDER, check_output_dir

    (tmp_path / "run" / JOB_FOLDER).mkdir(parents=True)
    (tmp_path / "run" / JOB_FOLDER / "train-3.out").write_text("log")
    assert check_output_dir(tmp_path / "run", lambda path: False, "a training run") == tmp_path / "run"
    (tmp_path / "run" / "notes.txt").write_text("my notes")
    with pytest.raises(SpecdraftError, match="not a training run"):
        check_output_dir(tmp_path / "run", lambda path: False, "a training run")


@pytest.mark.parametrize("command", ["train", "distill-data", "eval"])
def test_an_unwritable_output_directory_is_one_line_before_the_work(tmp_path, trained, tiny_target_dir, distilled,
                                                                     capsys, monkeypatch, command):
    """A directory under a file cannot be made (what a read-only disk also refuses); the target never loads."""
    from tests.test_train_export_eval import make_recipe

    (tmp_path / "file").write_text("x")
    out = tmp_path / "file" / "out"
    monkeypatch.setattr("specdraft.targets.load.load_target", lambda *a, **k: pytest.fail("the target loaded"))
    recipe = make_recipe(tmp_path, tiny_target_dir, distilled, max_steps=2, val_every_steps=2)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "hello"}\n')
    argv = {"train": ["train", recipe, f"train.output_dir={out}"],
            "distill-data": ["distill-data", recipe, f"data.prompts=[{prompts}]", f"distill.output_dir={out}"],
            "eval": ["eval", copy_export(trained, tmp_path), "--out", out]}[command]
    one_line_error(capsys, argv, f"cannot write {tmp_path / 'file'}")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only directory: the test above covers it")
def test_a_read_only_output_directory_for_eval(tmp_path, trained, capsys, monkeypatch):
    out = tmp_path / "ro"
    out.mkdir()
    out.chmod(0o500)
    monkeypatch.setattr("specdraft.eval.run.load_target", lambda *a, **k: pytest.fail("the target loaded"))
    try:
        one_line_error(capsys, ["eval", copy_export(trained, tmp_path), "--out", out], f"cannot write {out}")
    finally:
        out.chmod(0o700)


def test_a_full_disk_under_the_training_logs_is_one_line(tmp_path, trained, tiny_target_dir, distilled, capsys,
                                                          monkeypatch):
    """Lightning's CSV logs and the step times are plain appends: a full disk there is one line too."""
    from specdraft.train.timing import StepTimes

    recipe = copy_run(trained, tmp_path, tiny_target_dir, distilled, log_every_steps=1)
    before = (tmp_path / "run" / "checkpoints" / "last.ckpt").read_bytes()

    def full_disk(self, row):
        raise OSError(errno.ENOSPC, "No space left on device", str(self.path))

    monkeypatch.setattr(StepTimes, "_append", full_disk)
    one_line_error(capsys, ["train", recipe], "step_times.csv: No space left on device")
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").read_bytes() == before
