"""`specdraft slurm`: the rendered sbatch scripts (no SLURM needed), and jobs on a real SLURM (marker `slurm`;
skipped unless `sinfo` finds a cluster: `bash tools/slurm/local_cluster.sh` starts a one-node one here, as CI
does). A tiny CPU training job is preempted once and must end where an uninterrupted run ends; a distill-data
array of three workers must write what one worker writes. About 3 minutes on 2 cores."""
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from datasets import load_from_disk
from safetensors.torch import load_file

from specdraft import cli
from specdraft.data.format import dataset_dir
from tests.test_train_export_eval import make_recipe

REPO = Path(__file__).resolve().parents[1]
STEPS, CHECKPOINT_EVERY = 40, 10


def sbatch_options(script: str) -> dict:
    """{option: value} of the script's #SBATCH lines."""
    found = re.findall(r"^#SBATCH --([\w-]+)(?:=(.*))?$", script, flags=re.M)
    return {name: value for name, value in found}


def srun_words(script: str) -> list:
    (line,) = [line for line in script.splitlines() if line.startswith("srun ")]
    return shlex.split(line)


def test_dry_run_train_script(tmp_path, tiny_target_dir, distilled, capsys):
    recipe_path = make_recipe(tmp_path, tiny_target_dir, distilled)
    assert cli.main(["slurm", "train", str(recipe_path), "--nodes", "2", "--gpus-per-node", "4", "--partition",
                     "gpu", "--time", "2:00:00", "--account", "lab", "--mem", "200G", "--cpus-per-task", "8",
                     "--dry-run", "train.max_steps=7", "train.lr=1e-3"]) == 0
    printed = capsys.readouterr().out
    result = json.loads(printed.strip().splitlines()[-1])
    script = Path(result["script"]).read_text()
    assert result["job_id"] is None and script.strip() in printed and Path(result["script"]).parent == \
        tmp_path / "run" / "slurm"
    assert sbatch_options(script) == {
        "job-name": "specdraft-train", "nodes": "2", "ntasks-per-node": "4", "gpus-per-node": "4",
        "output": str(tmp_path / "run" / "slurm" / "train-%j.out"), "open-mode": "append", "requeue": "",
        "signal": "USR1@120", "partition": "gpu", "account": "lab", "time": "2:00:00", "cpus-per-task": "8",
        "mem": "200G"}
    words = srun_words(script)
    assert words[:6] == ["srun", "--kill-on-bad-exit=1", sys.executable, "-m", "specdraft.cli", "train"]
    assert words[6:] == [str(recipe_path), "train.resume=auto", "train.max_steps=7", "train.lr=1e-3",
                         "train.num_nodes=2", "train.devices=4"]
    assert f"\ncd {shlex.quote(str(Path.cwd()))}\n" in script
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


def test_dry_run_distill_array(tmp_path, tiny_target_dir, distilled, capsys):
    recipe_path = make_recipe(tmp_path, tiny_target_dir, distilled)
    assert cli.main(["slurm", "distill-data", str(recipe_path), "--nodes", "2", "--gpus-per-node", "4",
                     "--dry-run", "distill.batch_size=64"]) == 0
    script = Path(json.loads(capsys.readouterr().out.strip().splitlines()[-1])["script"]).read_text()
    options = sbatch_options(script)
    assert (options["array"], options["gpus"], options["ntasks"]) == ("0-7", "1", "1")
    assert options["output"] == str(distilled / "slurm" / "distill-data-%A_%a.out")
    assert srun_words(script)[1:] == [sys.executable, "-m", "specdraft.cli", "distill-data", str(recipe_path),
                                      "distill.batch_size=64"]
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


@pytest.mark.parametrize("argv, message", [
    (["--gpus-per-node", "0", "train.strategy=deepspeed_stage_2"], "train.strategy=deepspeed_stage_2 needs GPUs"),
    (["--nodes", "0"], "--nodes must be at least 1, got 0"),
    (["--template", "/nowhere/x.sbatch"], "sbatch template not found: /nowhere/x.sbatch"),
    (["train.nope=1"], "unknown recipe key 'train.nope'"),
])
def test_slurm_bad_input(tmp_path, tiny_target_dir, distilled, capsys, argv, message):
    recipe_path = make_recipe(tmp_path, tiny_target_dir, distilled)
    assert cli.main(["slurm", "train", str(recipe_path), "--dry-run", *argv]) == 2
    assert message in capsys.readouterr().err


# ---------------------------------------------------------------- a real SLURM


def _cluster_or_skip() -> None:
    if shutil.which("sinfo") is None or shutil.which("sbatch") is None:
        pytest.skip("SLURM is not installed (sinfo/sbatch not found); bash tools/slurm/local_cluster.sh starts one")
    try:
        done = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        pytest.skip("no SLURM cluster answers (sinfo timed out)")
    if done.returncode != 0 or not re.search(r"idle|mixed|allocated", done.stdout):
        pytest.skip(f"no SLURM cluster answers: sinfo says {(done.stderr or done.stdout).strip()[:200]!r}")


def _env() -> dict:
    """The job's environment (sbatch exports the submitter's): this checkout, one thread, no SLURM vars."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return {**env, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


def _specdraft(*argv: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "specdraft.cli", *argv], cwd=REPO, env=_env(),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def job_state(job_id: str) -> dict:
    """`scontrol show job` as {key: value} (array jobs: one task's line per element)."""
    done = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True)
    line = done.stdout.strip().splitlines()[0] if done.stdout.strip() else ""
    return dict(item.split("=", 1) for item in line.split() if "=" in item)


def wait_for(condition, what: str, timeout: float, logs: Path):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    tails = [f"--- {path.name}\n{path.read_text()[-3000:]}" for path in sorted(logs.glob("*.out"))]
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}\n" + "\n".join(tails))


def _all_done(job_id: str) -> bool:
    done = subprocess.run(["squeue", "-h", "-j", job_id], capture_output=True, text=True)
    return done.returncode == 0 and not done.stdout.strip()


def _release_when_pending(job_id: str, logs: Path) -> None:
    """A requeued job waits ~2 min (its BeginTime) before it may start again; the test starts it now."""
    wait_for(lambda: job_state(job_id).get("JobState") == "PENDING", "the requeued job to be pending", 120, logs)
    subprocess.run(["scontrol", "update", f"jobid={job_id}", "starttime=now"], check=True)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, tiny_target_dir, distilled):
    """The reference: the same training in one go, outside SLURM."""
    _cluster_or_skip()
    tmp_path = tmp_path_factory.mktemp("straight")
    recipe_path = make_recipe(tmp_path, tiny_target_dir, distilled, max_steps=STEPS, val_every_steps=CHECKPOINT_EVERY)
    _specdraft("train", str(recipe_path))
    return tmp_path / "run"


def _submit_training(tmp_path, tiny_target_dir, distilled) -> tuple:
    recipe_path = make_recipe(tmp_path, tiny_target_dir, distilled, max_steps=STEPS, val_every_steps=CHECKPOINT_EVERY)
    result = _specdraft("slurm", "train", str(recipe_path), "--nodes", "1", "--gpus-per-node", "0",
                        "--cpus-per-task", "1", "--time", "00:30:00")
    run = tmp_path / "run"
    wait_for(lambda: (run / "checkpoints" / "last.ckpt").exists(), "the first checkpoint", 300, run / "slurm")
    return result["job_id"], run


def _finished_log(job_id: str, run: Path) -> str:
    wait_for(lambda: _all_done(job_id), "the job to finish", 600, run / "slurm")
    state = job_state(job_id)
    log = (run / "slurm" / f"train-{job_id}.out").read_text()
    assert (state["JobState"], state["Restarts"]) == ("COMPLETED", "1"), log[-3000:]
    return log


@pytest.mark.slurm
def test_training_requeued_once_ends_like_an_uninterrupted_run(tmp_path, tiny_target_dir, distilled, uninterrupted):
    job_id, run = _submit_training(tmp_path, tiny_target_dir, distilled)
    assert not (run / "train_summary.json").exists(), "the job finished before it could be preempted"
    subprocess.run(["scontrol", "requeue", job_id], check=True)
    _release_when_pending(job_id, run / "slurm")
    log = _finished_log(job_id, run)
    step = int(re.search(r"resumed \S+last\.ckpt at step (\d+)", log).group(1))
    assert step % CHECKPOINT_EVERY == 0 and CHECKPOINT_EVERY <= step < STEPS
    summary, expected = (json.loads((path / "train_summary.json").read_text()) for path in (run, uninterrupted))
    assert summary["steps"] == expected["steps"] == STEPS
    assert summary["best"] == pytest.approx(expected["best"], rel=1e-4)
    weights, expected_weights = (load_file(path / "last" / "draft.safetensors") for path in (run, uninterrupted))
    for name, weight in expected_weights.items():
        torch.testing.assert_close(weights[name], weight, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.slurm
def test_sigusr1_saves_requeues_and_resumes(tmp_path, tiny_target_dir, distilled):
    _cluster_or_skip()
    job_id, run = _submit_training(tmp_path, tiny_target_dir, distilled)
    subprocess.run(["scancel", "--signal=USR1", job_id], check=True)  # what --signal=USR1@S sends before the limit
    wait_for(lambda: (run / "hpc_ckpt_1.ckpt").exists(), "Lightning's preemption checkpoint", 120, run / "slurm")
    _release_when_pending(job_id, run / "slurm")
    log = _finished_log(job_id, run)
    saved_at = torch.load(run / "hpc_ckpt_1.ckpt", map_location="cpu", weights_only=False)["global_step"]
    resumed = re.search(r"resumed (\S+) at step (\d+)", log)
    assert resumed, log[-3000:]
    # The signal may land while last.ckpt is being written, or the job may pass a checkpoint step before the
    # requeue stops it: then last.ckpt is the newer one, and resuming from it loses nothing either.
    assert Path(resumed.group(1)).name in ("hpc_ckpt_1.ckpt", "last.ckpt"), resumed.group(0)
    assert CHECKPOINT_EVERY <= saved_at <= int(resumed.group(2)) < STEPS, (saved_at, resumed.group(0))
    assert json.loads((run / "train_summary.json").read_text())["steps"] == STEPS


@pytest.mark.slurm
def test_distill_array_of_three_equals_one_worker(tmp_path, tiny_target_dir):
    _cluster_or_skip()
    from tests.test_distill_workers import make_recipe as distill_recipe

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"question {i}"}) + "\n" for i in range(7)))
    for name in ("one", "array"):  # writes NAME/recipe.yaml, output in NAME/out
        (tmp_path / name).mkdir()
        distill_recipe(tmp_path / name, tiny_target_dir, prompts)
    single = _specdraft("distill-data", str(tmp_path / "one" / "recipe.yaml"))
    result = _specdraft("slurm", "distill-data", str(tmp_path / "array" / "recipe.yaml"), "--workers", "3",
                        "--cpus-per-task", "1")
    out = tmp_path / "array" / "out"
    wait_for(lambda: _all_done(result["job_id"]), "the array to finish", 600, out / "slurm")
    assert json.loads((out / "counts.json").read_text()) == single
    rows = load_from_disk(str(dataset_dir(out))).to_list()
    assert rows == load_from_disk(str(dataset_dir(tmp_path / "one" / "out"))).to_list()
    assert len({row["index"] for row in rows}) == len(rows) == 7
    throughput = json.loads((out / "throughput.json").read_text())
    assert throughput["workers"] == 3 and sorted(w["worker"] for w in throughput["per_worker"]) == [0, 1, 2]
