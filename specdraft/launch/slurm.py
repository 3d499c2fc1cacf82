"""`specdraft slurm train|distill-data RECIPE --nodes N --gpus-per-node G [...] [key=value ...]`.

Renders an sbatch script from a template (specdraft/launch/templates/train.sbatch or distill-data.sbatch, shipped
in the package, or --template PATH), writes it beside the run's output (OUTPUT_DIR/slurm/KIND.sbatch, logs in the
same folder) and submits it with `sbatch` unless --dry-run, which prints it instead. The recipe is loaded (with
the overrides) first, so a bad recipe fails here and not in the queue.

Templates are `string.Template` text; the placeholders (docs/slurm.md):
  ${job_name} ${nodes} ${tasks_per_node} ${array} ${log} ${signal_seconds} ${workdir} ${command} ${directives}
${directives} holds the optional #SBATCH lines (partition, account, time, memory, CPUs, GPUs). Anything else
with a `$` (the shell's own variables) is left as it is.

train: N nodes x G tasks (one per GPU; one CPU task per node when G is 0), srun, --requeue and
--signal=USR1@S; the command adds `train.resume=auto` and the layout (train.num_nodes, train.devices), which the
trainer checks against srun's (specdraft.train.cluster). Rank 0 listens at the first node of the job.
distill-data: an array of W tasks (default N x G, or N on CPUs), one GPU each; every task is one worker.
"""
from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from string import Template
from typing import List, Optional

from specdraft.config import Recipe
from specdraft.recipes import load_recipe
from specdraft.core.errors import SpecdraftError, choices_error
from specdraft.core.io import JOB_FOLDER, write_text

TEMPLATES = Path(__file__).resolve().parent / "templates"
KINDS = ("train", "distill-data")


@dataclass
class SlurmJob:
    kind: str
    """train or distill-data."""
    recipe: str
    overrides: List[str] = field(default_factory=list)
    nodes: int = 1
    gpus_per_node: int = 0
    """GPUs per node (train: one task per GPU); 0 runs on CPUs."""
    workers: Optional[int] = None
    """distill-data array tasks; None: nodes x gpus_per_node (nodes on CPUs)."""
    partition: Optional[str] = None
    time: Optional[str] = None
    account: Optional[str] = None
    cpus_per_task: Optional[int] = None
    mem: Optional[str] = None
    signal_seconds: int = 120
    """train: SIGUSR1 this long before the time limit (Lightning saves and requeues)."""
    template: Optional[str] = None
    """A template of your own instead of the packaged templates/KIND.sbatch."""
    trust_remote_code: bool = False
    """Pass --trust-remote-code to the job's command (the target's own code runs)."""
    trust_checkpoint: bool = False
    """train: pass --trust-checkpoint to the job's command (resume a DeepSpeed checkpoint this user did not sign)."""


def _check(job: SlurmJob, recipe: Recipe) -> None:
    if job.kind not in KINDS:
        raise choices_error("slurm job kind", job.kind, KINDS)
    for name in ("nodes", "workers", "signal_seconds", "cpus_per_task"):
        value = getattr(job, name)
        if value is not None and value < 1:
            raise SpecdraftError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    if job.gpus_per_node < 0:
        raise SpecdraftError(f"--gpus-per-node must be 0 (CPUs) or more, got {job.gpus_per_node}")
    if job.kind == "train" and job.gpus_per_node == 0 and recipe.train.strategy.startswith("deepspeed"):
        raise SpecdraftError(f"train.strategy={recipe.train.strategy} needs GPUs; pass --gpus-per-node")


def _directives(job: SlurmJob, gpus_line: str) -> str:
    """The optional #SBATCH lines, in the order sbatch documents them."""
    lines = [("partition", job.partition), ("account", job.account), ("time", job.time),
             ("cpus-per-task", job.cpus_per_task), ("mem", job.mem)]
    directives = [f"#SBATCH --{name}={value}" for name, value in lines if value is not None]
    return "\n".join(directives + ([gpus_line] if gpus_line else []))


def _consents(job: SlurmJob) -> List[str]:
    """The trust flags given to `specdraft slurm`, passed on to the job's command."""
    flags = ["--trust-remote-code"] if job.trust_remote_code else []
    return flags + (["--trust-checkpoint"] if job.trust_checkpoint and job.kind == "train" else [])


def _command(kind: str, recipe_path: Path, overrides: List[str]) -> str:
    words = [sys.executable, "-m", "specdraft.cli", kind, str(recipe_path), *overrides]
    return " ".join(shlex.quote(word) for word in words)


def _values(job: SlurmJob, recipe: Recipe, folder: Path) -> dict:
    """Placeholder values for the job's template."""
    recipe_path = Path(job.recipe).resolve()
    common = {"job_name": f"specdraft-{job.kind}", "nodes": job.nodes, "workdir": shlex.quote(str(Path.cwd())),
              "signal_seconds": job.signal_seconds, "tasks_per_node": max(job.gpus_per_node, 1), "array": ""}
    if job.kind == "train":
        layout = [f"train.num_nodes={job.nodes}", f"train.devices={max(job.gpus_per_node, 1)}"]
        command = _command("train", recipe_path, [*_consents(job), "train.resume=auto", *job.overrides, *layout])
        gpus = f"#SBATCH --gpus-per-node={job.gpus_per_node}" if job.gpus_per_node else ""
        return {**common, "log": folder / "train-%j.out", "command": command,
                "directives": _directives(job, gpus)}
    workers = job.workers or job.nodes * max(job.gpus_per_node, 1)
    command = _command("distill-data", recipe_path, [*_consents(job), *job.overrides])
    return {**common, "array": f"0-{workers - 1}", "log": folder / "distill-data-%A_%a.out", "command": command,
            "directives": _directives(job, "#SBATCH --gpus=1" if job.gpus_per_node else "")}


def _template(job: SlurmJob) -> Template:
    path = Path(job.template) if job.template else TEMPLATES / f"{job.kind}.sbatch"
    if not path.is_file():
        raise SpecdraftError(f"sbatch template not found: {path} (pass --template PATH; the default templates "
                             f"ship in specdraft/launch/templates/)")
    return Template(path.read_text())


def output_dir(job: SlurmJob, recipe: Recipe) -> Path:
    out = recipe.train.output_dir if job.kind == "train" else recipe.distill.output_dir
    return Path(out).expanduser().resolve()


def render(job: SlurmJob) -> tuple:
    """-> (script text, the path it is written to)."""
    recipe = load_recipe(job.recipe, job.overrides, job.trust_remote_code)
    _check(job, recipe)
    folder = output_dir(job, recipe) / JOB_FOLDER
    values = {name: str(value) for name, value in _values(job, recipe, folder).items()}
    return _template(job).safe_substitute(values), folder / f"{job.kind}.sbatch"


def submit(script: Path) -> str:
    """sbatch SCRIPT -> the job id."""
    if shutil.which("sbatch") is None:
        raise SpecdraftError("sbatch not found: run this on a SLURM login node, or use --dry-run to get the script")
    done = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True)
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines() or ["(no output)"]
        raise SpecdraftError(f"sbatch {script} failed: {lines[-1]}")
    return done.stdout.strip().split(";")[0]


def run_slurm(job: SlurmJob, dry_run: bool = False) -> dict:
    """Write the job's sbatch script; print it (dry run) or submit it. Returns the script path and job id."""
    text, script = render(job)
    write_text(script, text)
    if dry_run:
        print(text)
        return {"script": str(script), "job_id": None}
    job_id = submit(script)
    print(f"submitted {job.kind} as SLURM job {job_id}: {script} (logs beside it)")
    return {"script": str(script), "job_id": job_id}
