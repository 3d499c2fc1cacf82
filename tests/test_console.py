"""What a user sees of the libraries: Lightning's lines once, no advertisement, no accelerator census or DeepSpeed
accelerator guess, no library deprecation, no bar for a model load that takes a blink, no log record inside a
progress bar's line (ours, Lightning's or DeepSpeed's), bars redrawn on time, a loading line while a model loads.
The smoke path's whole log is checked with its run (test_smoke_smollm2.py) by `log_problems` (logs.py)."""
import io
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from specdraft.core import console
from tests.logs import log_problems, visible_lines

REPO = Path(__file__).resolve().parents[1]
SCRIPT = """
import logging, warnings
from specdraft.core.console import quiet_dependencies
quiet_dependencies()
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
import lightning
from lightning.pytorch.utilities.rank_zero import rank_zero_info
rank_zero_info("GPU available: False, used: False")
rank_zero_info("TPU available: False, using: 0 TPU cores")
rank_zero_info("`Trainer.fit` stopped: `max_steps=2` reached.")
rank_zero_info("💡 Tip: For seamless cloud logging and experiment tracking, try installing [litlogger]")
rank_zero_info("\\nDetected KeyboardInterrupt, attempting graceful shutdown ...")
from deepspeed.accelerator import get_accelerator
get_accelerator()
warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated", FutureWarning)
warnings.warn("a warning a user can act on", UserWarning)
warnings.warn("The `srun` command is available on your system but is not used. HINT: ...", UserWarning)
logging.getLogger("specdraft.x").info("a line of ours")
"""


def test_library_lines_are_filtered_once():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600, cwd=REPO,
                          env={**os.environ, "PYTHONWARNINGS": ""})
    assert done.returncode == 0, done.stderr[-2000:]
    log = done.stdout + done.stderr
    assert log.count("`Trainer.fit` stopped: `max_steps=2` reached.") == 1
    assert "GPU available" not in log and "TPU available" not in log
    assert "a warning a user can act on" in log and "INFO specdraft.x: a line of ours" in log
    assert not log_problems(log), log_problems(log)
    assert "Detected KeyboardInterrupt" not in log and "deprecated" not in log and "srun" not in log


def test_a_model_loads_bars_are_off_and_others_stay():
    from transformers.utils.logging import tqdm

    from specdraft.core.console import quiet_transformers_bars

    quiet_transformers_bars()
    assert tqdm(range(2), desc="Loading weights").disable
    assert not tqdm(range(2), desc="Dequantizing", disable=False).disable


def test_the_log_checker_sees_repeats_and_tracebacks():
    assert log_problems("a\rb\nINFO: x\nINFO: x\nTraceback (most recent call last):\n") == \
        ["repeated: INFO: x", "traceback: Traceback (most recent call last):"]
    assert not log_problems("bar 1/2\rbar 2/2\nbar 1/2\rbar 2/2 done\n")  # a bar's frames: its last one shows
    finished = "eval: 100%|##########| 3/3 [00:16<00:00,  5.58s/prompt]"
    assert not log_problems(f"eval:  67%|#######   | 2/3\r{finished}\n{finished}\n")  # tqdm's close, redrawn
    assert log_problems(f"{finished}\nINFO: x\n{finished}\n") == [f"repeated: {finished}"]  # a second run's bar
    assert log_problems("eval:  67%|#   | 2/3 [00:01<00:00]\neval:  67%|#   | 2/3 [00:01<00:00]\n")  # unfinished
    train = "train:   0%|          | 0/50 [00:00<?, ?step/s]"
    assert not log_problems(f"{train}\nINFO a: x\n{train}\nINFO b: y\n{train}\n")  # redrawn below each record



BARS_SCRIPT = """
import logging, sys, time
from tqdm import tqdm
from specdraft.core.console import log_through_bars, quiet_dependencies, route_library_logs
quiet_dependencies()
log_through_bars()
import lightning
from lightning.pytorch.utilities.rank_zero import rank_zero_info
import deepspeed.utils.logging  # DeepSpeed's own logger, onto stdout
if sys.argv[1] == "routed":
    route_library_logs()
bar = tqdm(total=24, desc="distill", unit="prompt")
bar.update(3)
logging.getLogger("data_gen.engine").info("distill.engine=auto: the static engine")
rank_zero_info("a line of Lightning's")
deepspeed.utils.logging.logger.warning("a line of DeepSpeed's")
bar.update(21)
bar.close()
print('{"result": 1}')
"""


@pytest.mark.parametrize("routed", [True, False])
def test_log_lines_never_land_inside_a_bar(routed):
    done = subprocess.run([sys.executable, "-c", BARS_SCRIPT, "routed" if routed else "raw"], capture_output=True,
                          text=True, timeout=600, cwd=REPO, env={**os.environ, "PYTHONWARNINGS": ""})
    assert done.returncode == 0, done.stderr[-2000:]
    inside = [p for p in log_problems(done.stdout + done.stderr) if p.startswith("log line inside a bar")]
    if routed:  # ours through the bar's writer; Lightning's and DeepSpeed's once their handlers are routed
        assert not inside and done.stdout == '{"result": 1}\n'  # stdout holds the result alone
        lines = visible_lines(done.stderr)
        assert "INFO data_gen.engine: distill.engine=auto: the static engine" in lines
        assert "INFO: a line of Lightning's" in lines and any(line.endswith("a line of DeepSpeed's") for line in lines)
    else:  # the checker sees Lightning's own handler write into the bar
        assert inside and all("INFO data_gen.engine" not in p for p in inside)


def test_the_checker_sees_a_log_record_written_into_a_bar():
    bar = "distill:   0%|          | 0/24 [00:00<?, ?prompt/s]"
    assert log_problems(f"{bar}INFO data_gen.engine: distill.engine=auto: static\n") == \
        [f"log line inside a bar: {bar}INFO data_gen.engine: distill.engine=auto: static"]
    assert log_problems("loading target pkg:x.gguf… 00:12WARNING specdraft.x: y\n")  # a loading line too
    assert not log_problems(f"{bar}\r          \rINFO data_gen.engine: distill.engine=auto: static\n{bar}\n")
    assert not log_problems("INFO specdraft.x: 3/24 [00:01] of them\n")  # a record that quotes a bar is no bar
    assert log_problems("INFO: GPU available: False, used: False\n") == \
        ["accelerator census: INFO: GPU available: False, used: False"]


class Bar:
    """What Ticker and the loading line need of a tqdm bar, counted."""

    def __init__(self):
        self.refreshes = 0

    def refresh(self):
        self.refreshes += 1


def test_a_ticker_redraws_its_bar_on_time_until_stopped():
    bar = Bar()
    ticker = console.Ticker(bar, every=0.01)
    time.sleep(0.2)
    ticker.stop()
    drawn = bar.refreshes
    assert drawn >= 3
    time.sleep(0.05)
    assert bar.refreshes == drawn and not ticker.thread.is_alive()
    bar.last_print_t = time.time() + 3600  # the bar printed just now (as far as a second goes): no second frame
    ticker = console.Ticker(bar, every=0.01)
    time.sleep(0.1)
    ticker.stop()
    assert bar.refreshes == drawn


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_loading_line_names_the_inner_load_and_is_cleared_at_the_end(monkeypatch):
    stderr = Terminal()
    monkeypatch.setattr(sys, "stderr", stderr)
    with console.loading("loading draft runs/x/export"):
        outer = console._OPEN_LOADS[0]
        with console.loading("loading target pkg:y.gguf"):
            assert outer.desc == "loading target pkg:y.gguf" and len(console._OPEN_LOADS) == 1
        assert outer.desc == "loading draft runs/x/export"
    assert not console._OPEN_LOADS
    assert "loading draft runs/x/export… 00:00" in stderr.getvalue()
    assert visible_lines(stderr.getvalue()) == []  # cleared: what follows is the command's own output
    into_a_file = io.StringIO()
    monkeypatch.setattr(sys, "stderr", into_a_file)
    with console.loading("loading target pkg:y.gguf"):
        pass
    assert into_a_file.getvalue() == "" and not console._OPEN_LOADS  # no frames in a log file


def test_the_train_bar_counts_every_step_and_reads_metrics_at_logged_ones(monkeypatch):
    from specdraft.config import TrainConfig
    from specdraft.train.progress import TrainProgress

    monkeypatch.setattr(sys, "stderr", io.StringIO())
    progress = TrainProgress(TrainConfig(max_steps=10, log_every_steps=5), ["train/loss"])
    reads = []
    trainer = SimpleNamespace(is_global_zero=True, global_step=0, logged_metrics={}, sanity_checking=False)
    module = SimpleNamespace(train_metrics={"train/loss": 2.0})
    monkeypatch.setattr(progress, "_shown", lambda t, m: reads.append(t.global_step) or {"loss": "2"})
    progress.on_train_start(trainer, module)
    assert progress.ticker is not None and progress.ticker.thread.is_alive()
    for step in (1, 2, 2, 3, 4, 5, 6):  # step 2 twice: a micro-batch inside an accumulated step
        trainer.global_step = step
        progress.on_train_batch_end(trainer, module, None, None, 0)
        assert progress.bar.n == step
    assert reads == [5]  # the metrics (a device read) at the logged step alone
    ticker = progress.ticker
    progress.on_train_end(trainer, module)
    assert progress.bar is None and not ticker.thread.is_alive()


def test_a_loop_bar_is_redrawn_on_time_and_closed_with_its_loop(monkeypatch):
    stderr = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    monkeypatch.setattr(console, "redraw_every", lambda: 0.02)
    monkeypatch.setattr(console, "SAME_FRAME_SECONDS", 0.0)  # frames a few ms apart: redrawn anyway, here
    items = []
    for item in console.ticking(range(2), desc="eval", unit="prompt"):
        time.sleep(0.15)  # a prompt that takes longer than a redraw
        items.append(item)
    assert items == [0, 1]
    frames = stderr.getvalue().count("eval:")
    assert frames >= 5  # redrawn between items, not only when one ends
    time.sleep(0.1)
    assert stderr.getvalue().count("eval:") == frames  # its ticker stopped with the loop
