"""What a user sees of the libraries: Lightning's lines once, no advertisement, no DeepSpeed accelerator guess, no
library deprecation, no bar for a model load that takes a blink. The smoke path's whole log is checked with its run
(test_smoke_smollm2.py) by `log_problems` (logs.py)."""
import os
import subprocess
import sys
from pathlib import Path

from tests.logs import log_problems

REPO = Path(__file__).resolve().parents[1]
SCRIPT = """
import logging, warnings
from specdraft.core.console import quiet_dependencies
quiet_dependencies()
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
import lightning
from lightning.pytorch.utilities.rank_zero import rank_zero_info
rank_zero_info("GPU available: False, used: False")
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
    assert log.count("GPU available: False, used: False") == 1
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

