"""`specdraft slurm`: the rendered sbatch scripts (no SLURM needed), two nodes started by torchrun on this machine
(no SLURM needed), and jobs on a real SLURM (marker `slurm`; skipped unless `sinfo` finds a cluster: `bash
tools/slurm/local_cluster.sh` starts a two-node one here, as CI does). A tiny CPU training job is preempted once
and must end where an uninterrupted run ends, on one node and on two; a distill-data array of three workers must
write what one worker writes. About 6 minutes on 2 cores."""
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from datasets import load_from_disk
from lightning.pytorch.plugins.environments import SLURMEnvironment
from safetensors.torch import load_file

from specdraft import cli
from specdraft.config import TrainConfig
from specdraft.core.errors import SpecdraftError
from specdraft.data.format import dataset_dir
from specdraft.train.cluster import cluster_plugins, node_layout
from specdraft.testing.ports import free_port
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


def _launched_by(monkeypatch, **env) -> None:
    """This process as a launcher's rank: no launcher variables but `env`."""
    for name in [k for k in os.environ if k.startswith(("SLURM_", "TORCHELASTIC_"))] + ["LOCAL_WORLD_SIZE"]:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def test_torchrun_layout_wins_inside_slurm(monkeypatch):
    """torchrun started inside a SLURM allocation (an srun task per node, each running torchrun): Lightning's
    torchrun environment, not SLURM's; train.devices=auto takes LOCAL_WORLD_SIZE; a recipe whose num_nodes
    disagrees is a one-line error."""
    _launched_by(monkeypatch, TORCHELASTIC_RUN_ID="r", LOCAL_WORLD_SIZE="1", WORLD_SIZE="2", SLURM_NTASKS="2",
                 SLURM_JOB_NAME="specdraft-train", SLURM_NNODES="2")
    assert cluster_plugins() == []
    assert node_layout(TrainConfig(devices="auto", num_nodes=2)) == (1, 2)
    with pytest.raises(SpecdraftError, match=re.escape(
            "torchrun started the ranks with LOCAL_WORLD_SIZE=1, WORLD_SIZE=2, but the recipe says train.num_nodes=1 "
            "(the launcher's: 2): pass train.num_nodes=2 train.devices=1")):
        node_layout(TrainConfig(devices="1", num_nodes=1))


def test_srun_layout(monkeypatch):
    """Under srun: Lightning's SLURM environment with auto-requeue on SIGUSR1; devices=auto is
    SLURM_NTASKS_PER_NODE; outside any launcher the recipe's layout goes to Lightning as it is."""
    _launched_by(monkeypatch, SLURM_NTASKS="4", SLURM_JOB_NAME="specdraft-train", SLURM_NTASKS_PER_NODE="2",
                 SLURM_NNODES="2")
    (plugin,) = cluster_plugins()
    assert isinstance(plugin, SLURMEnvironment) and plugin.auto_requeue and plugin.requeue_signal == signal.SIGUSR1
    assert node_layout(TrainConfig(devices="auto", num_nodes=2)) == (2, 2)
    with pytest.raises(SpecdraftError, match=r"train\.devices=4 \(the launcher's: 2\)"):
        node_layout(TrainConfig(devices="4", num_nodes=2))
    _launched_by(monkeypatch)
    assert cluster_plugins() == [] and node_layout(TrainConfig(devices="auto", num_nodes=3)) == ("auto", 3)


# ---------------------------------------------------------------- a real SLURM


def _cluster_or_skip(nodes: int = 1) -> None:
    """Skips unless a SLURM cluster answers with at least `nodes` nodes up."""
    if shutil.which("sinfo") is None or shutil.which("sbatch") is None:
        pytest.skip("SLURM is not installed (sinfo/sbatch not found); bash tools/slurm/local_cluster.sh starts one")
    try:
        done = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        pytest.skip("no SLURM cluster answers (sinfo timed out)")
    up = {line.split()[0] for line in done.stdout.splitlines() if re.search(r" (idle|mixed|allocated)\S*$", line)}
    if done.returncode != 0 or not up:
        pytest.skip(f"no SLURM cluster answers: sinfo says {(done.stderr or done.stdout).strip()[:200]!r}")
    if len(up) < nodes:
        pytest.skip(f"the SLURM cluster has {len(up)} node(s) up, {nodes} needed: bash tools/slurm/local_cluster.sh "
                    f"{nodes} starts {nodes} on this machine")


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


def _submit_training(tmp_path, tiny_target_dir, distilled, nodes: int = 1, **train) -> tuple:
    recipe_path = make_recipe(tmp_path, tiny_target_dir, distilled, max_steps=STEPS, val_every_steps=CHECKPOINT_EVERY,
                              **train)
    result = _specdraft("slurm", "train", str(recipe_path), "--nodes", str(nodes), "--gpus-per-node", "0",
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


# ---------------------------------------------------------------- two nodes, on this machine
# Two ranks, one a node, against one node running the same two ranks: the same global batch (2 ranks x 2 rows),
# seed and data order (rows are dealt by global rank). DDP averages the two ranks' gradients with one gloo
# all-reduce: each element is a + b, which floating point gives exactly whichever rank's operand comes first, so
# nothing depends on the launcher and the weights must be equal bit for bit.

TWO_RANKS = {"strategy": "ddp", "micro_batch_size": 2}


def _assert_same_weights(run: Path, expected: Path) -> None:
    weights, expected_weights = (load_file(path / "last" / "draft.safetensors") for path in (run, expected))
    assert weights.keys() == expected_weights.keys()
    for name, weight in expected_weights.items():
        assert torch.equal(weights[name], weight), f"{name} differs: {(weights[name] - weight).abs().max()}"


def _two_ranks_summary(run: Path) -> dict:
    """The run's summary, checked to be one of two ranks reading 2 rows of 32 tokens each a step."""
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["steps"] == STEPS and summary["tokens"] == STEPS * 2 * 2 * 32, summary
    return summary


@pytest.fixture(scope="module")
def one_node_two_ranks(tmp_path_factory, tiny_target_dir, distilled):
    """The reference: the training on one node, Lightning starting its two ranks (train.devices=2)."""
    tmp_path = tmp_path_factory.mktemp("one_node")
    recipe_path = make_recipe(tmp_path, tiny_target_dir, distilled, max_steps=STEPS, val_every_steps=CHECKPOINT_EVERY,
                              **TWO_RANKS)
    _specdraft("train", str(recipe_path), "train.devices=2")
    _two_ranks_summary(tmp_path / "run")
    return tmp_path / "run"


@pytest.mark.slow
def test_torchrun_two_nodes_equal_one_node(tmp_path, tiny_target_dir, distilled, one_node_two_ranks):
    """torchrun --nnodes 2 --nproc-per-node 1, one launcher a node (--node-rank 0 and 1), rendezvous at
    127.0.0.1: two ranks on two nodes, gloo, the weights of the one-node run."""
    recipe_path = make_recipe(tmp_path, tiny_target_dir, distilled, max_steps=STEPS, val_every_steps=CHECKPOINT_EVERY,
                              **TWO_RANKS)
    port = str(free_port())
    env = {k: v for k, v in _env().items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    launchers = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                                   "--nproc-per-node", "1", "--node-rank", str(node), "--master-addr", "127.0.0.1",
                                   "--master-port", port, "-m", "specdraft.cli", "train", str(recipe_path),
                                   "train.num_nodes=2", "train.devices=1"],
                                  cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for node in (0, 1)]
    logs = []
    try:
        for launcher in launchers:
            logs.append(launcher.communicate(timeout=600)[0])
    finally:
        for launcher in launchers:
            launcher.kill()
    assert [launcher.returncode for launcher in launchers] == [0, 0], "\n".join(log[-3000:] for log in logs)
    assert "GLOBAL_RANK: 0, MEMBER: 1/2" in logs[0] and "GLOBAL_RANK: 1, MEMBER: 2/2" in logs[1]
    _two_ranks_summary(tmp_path / "run")
    _assert_same_weights(tmp_path / "run", one_node_two_ranks)


@pytest.mark.slurm
def test_two_slurm_nodes_requeued_once_end_like_one_node(tmp_path, tiny_target_dir, distilled, one_node_two_ranks):
    """`specdraft slurm train --nodes 2`: one rank on each of two nodes (srun), preempted by `scontrol requeue`
    after its first checkpoint, restarted on two nodes, resumed: the weights of the uninterrupted one-node run."""
    _cluster_or_skip(nodes=2)
    job_id, run = _submit_training(tmp_path, tiny_target_dir, distilled, nodes=2, **TWO_RANKS)
    assert not (run / "train_summary.json").exists(), "the job finished before it could be preempted"
    state = job_state(job_id)
    assert state["NumNodes"] == "2" and state["NumTasks"] == "2", state
    subprocess.run(["scontrol", "requeue", job_id], check=True)
    _release_when_pending(job_id, run / "slurm")
    log = _finished_log(job_id, run)
    assert job_state(job_id)["NumNodes"] == "2"
    for rank in (0, 1):
        assert log.count(f"GLOBAL_RANK: {rank}, MEMBER: {rank + 1}/2") == 2, log[-3000:]  # started, restarted
    step = int(re.search(r"resumed \S+last\.ckpt at step (\d+)", log).group(1))
    assert step % CHECKPOINT_EVERY == 0 and CHECKPOINT_EVERY <= step < STEPS
    _two_ranks_summary(run)
    _assert_same_weights(run, one_node_two_ranks)
