"""What every benchmark suite of tools/bench/ shares: its markdown table, its JSON, the machine it ran on, the
environment of the processes it starts, and the parts of a suite that holds several tables.

A suite runs from the repository's root as a module, `python -m tools.bench.SUITE`, so that this checkout's
specdraft and the other suites import by their package names (`from tools.bench.suite import ...`).
"""
from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

REPO = Path(__file__).resolve().parents[2]


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A markdown table, as docs/benchmarks.md holds it: cells as given (str() of each), one row a line."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def fmt(value: Optional[float], spec: str = ".1f", none: str = "-") -> str:
    """A table cell of a number that may be missing (a failed row, a figure this device has not)."""
    return none if value is None else format(value, spec)


def json_path(out: str | Path, name: str) -> Path:
    """Where a suite's JSON goes: `out` itself when it names a .json file, else OUT/NAME.json."""
    out = Path(out)
    return out if out.suffix == ".json" else out / f"{name}.json"


def write_report(out: str | Path, report: dict, name: str) -> Path:
    """The report as JSON at json_path(out, name) (rewritten as a suite goes, so an interrupted run keeps it)."""
    from specdraft.core.io import write_json

    path = json_path(out, name)
    write_json(path, report)
    return path


def finish(table: str, out: str | Path, report: dict, name: str) -> dict:
    """A suite's end: its table printed, its JSON written, and where it went."""
    print(table)
    print(f"-> {write_report(out, report, name)}")
    return report


def split_overrides(values: List[str], overrides: List[str]) -> Tuple[List[str], List[str]]:
    """A list option's values, and the recipe overrides (key=value) that argparse gave it when they were typed after
    it (none of its values holds '=') -> (its values, every override)."""
    return [value for value in values if "=" not in value], overrides + [value for value in values if "=" in value]


def machine(device: Optional[str] = None) -> str:
    """The card a figure comes from (its CUDA name), or the host's CPU when `device` (default: CUDA if present)
    is not a GPU."""
    import torch

    if str(device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device or "cuda"))
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores"


def child_env(drop: Sequence[str] = (), **updates: str) -> dict:
    """This environment for a process a suite starts: the repository on PYTHONPATH (so it runs this checkout),
    variables starting with any of `drop` left out, then `updates`."""
    env = {k: v for k, v in os.environ.items() if not (drop and k.startswith(tuple(drop)))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(updates)
    return env


def kill_group(process: subprocess.Popen) -> None:
    """Kill what is left of a process group a suite started (start_new_session=True): ranks or workers after a
    crash or a timeout, so that no stray process holds a GPU for the next configuration."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the whole group has exited already
    process.wait()


def read_json(path: Path) -> dict:
    """A stage's JSON file, or {} where the stage has not written it (yet)."""
    return json.loads(path.read_text()) if path.is_file() else {}


def specdraft_stage(argv: List[str]) -> None:
    """`specdraft ARGV` in this process; a stage that fails stops the suite, naming its command."""
    from specdraft import cli

    if cli.main(argv) != 0:
        raise SystemExit(f"stage failed: specdraft {' '.join(argv)}")


def run_parts(parts: Dict[str, Callable[[List[str]], object]], argv: Optional[List[str]] = None):
    """A suite of several tables: `python -m tools.bench.SUITE [PART] ARGS...`, the first part by default."""
    argv = list(sys.argv[1:] if argv is None else argv)
    name = argv.pop(0) if argv and argv[0] in parts else next(iter(parts))
    return parts[name](argv)
