"""One distill-data process a worker slot writes into an output directory: a second one is refused in one line
naming the directory and the holder's pid; a lock left by a killed process is taken over; workers of other
settings may not share a directory; distill-data writes only into its own kind of directory. CPU, tiny target."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specdraft import cli
from specdraft.core.errors import SpecdraftError
from specdraft.core.io import directory_lock
from tests.test_hostile_files import one_line_error, tree

REPO = Path(__file__).resolve().parents[1]
HOLD = """
import sys, time
from specdraft.core.io import directory_lock
with directory_lock(sys.argv[1], sys.argv[2], "distill-data", {"fingerprint": sys.argv[3]}):
    print("held", flush=True)
    time.sleep(600)
"""


@pytest.fixture
def holder():
    """Start a process that holds DIRECTORY/.lock-SLOT until killed (-9); yields its starter."""
    started = []

    def start(directory: Path, slot: str, fingerprint: str = "x") -> subprocess.Popen:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        process = subprocess.Popen([sys.executable, "-c", HOLD, str(directory), slot, fingerprint], env=env,
                                   stdout=subprocess.PIPE, text=True)
        started.append(process)
        assert process.stdout.readline().strip() == "held"
        return process

    yield start
    for process in started:
        process.kill()
        process.wait()


def recipe(tmp_path: Path, target: Path, out: Path, max_new_tokens: int = 4) -> Path:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"question {i}?"}) + "\n" for i in range(3)))
    path = tmp_path / f"recipe-{max_new_tokens}.yaml"
    path.write_text(f"target: {{path: {target}}}\nmethod: {{name: eagle3}}\n"
                    f"data: {{prompts: [{prompts}], max_length: 256}}\n"
                    f"distill: {{output_dir: {out}, max_new_tokens: {max_new_tokens}, batch_size: 2, "
                    f"shard_size: 2}}\n")
    return path


def test_a_second_process_is_refused_and_a_killed_ones_lock_taken_over(tmp_path, tiny_target_dir, holder, capsys,
                                                                       caplog):
    out = tmp_path / "data"
    first = holder(out, "worker-0-of-1")  # the first distill-data (max_new_tokens 4), still running
    before = tree(out)
    one_line_error(capsys, ["distill-data", recipe(tmp_path, tiny_target_dir, out, max_new_tokens=16)],
                   f"{out} is in use by another distill-data (pid {first.pid} on ", "lock .lock-worker-0-of-1")
    assert tree(out) == before
    first.kill()  # kill -9: its lock file stays, its flock is gone
    first.wait()
    assert (out / ".lock-worker-0-of-1").is_file()
    with caplog.at_level("INFO", logger="specdraft.core.io"):
        assert cli.main(["distill-data", str(recipe(tmp_path, tiny_target_dir, out, max_new_tokens=16))]) == 0
    assert f"took over the lock of pid {first.pid}" in caplog.text
    assert json.loads((out / "fingerprint.json").read_text())["distill.max_new_tokens"] == 16
    assert not (out / ".lock-worker-0-of-1").exists()
    one_line_error(capsys, ["distill-data", recipe(tmp_path, tiny_target_dir, out, max_new_tokens=4)],
                   "holds shards distilled with a different distill.max_new_tokens")


def test_workers_of_other_settings_may_not_share_a_directory(tmp_path, holder):
    holder(tmp_path / "data", "worker-1-of-2", fingerprint="aaaa")
    with pytest.raises(SpecdraftError, match="in use by another distill-data with other settings .*worker-1-of-2"):
        with directory_lock(tmp_path / "data", "worker-0-of-2", "distill-data", {"fingerprint": "bbbb"},
                            peers_agree=True):
            pass
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == [".lock-worker-1-of-2"]
    with directory_lock(tmp_path / "data", "worker-0-of-2", "distill-data", {"fingerprint": "aaaa"},
                        peers_agree=True):  # a worker of the same job
        assert (tmp_path / "data" / ".lock-worker-0-of-2").is_file()


def test_a_lock_on_a_new_directory_leaves_nothing_behind(tmp_path):
    with directory_lock(tmp_path / "a" / "b", "w", "distill-data"):
        pass
    assert not (tmp_path / "a").exists()


def test_distill_writes_only_into_its_own_kind_of_directory(tmp_path, tiny_target_dir, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("my notes")
    one_line_error(capsys, ["distill-data", recipe(tmp_path, tiny_target_dir, out)],
                   f"{out} already holds files that are not a distill-data output")
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
