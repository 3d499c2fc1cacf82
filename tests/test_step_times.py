"""The per-step wall times of a training run (specdraft/train/timing.py): steady rates and reading the CSV back.
CPU, instant."""
import pytest

from specdraft.train.timing import is_logged_step, read_step_times, steady_rate


def test_steady_rate_leaves_the_warmup_out():
    # 100 tokens a step; the first step took 10 s (compiles), the others 0.5 s each
    rows = [(s, 10 + 0.5 * (s - 1), 100 * s) for s in range(1, 11)]
    assert steady_rate(rows, warmup_rows=1) == pytest.approx(200.0)
    assert steady_rate(rows, warmup_rows=0) == pytest.approx(200.0)  # from the end of the first step
    assert steady_rate(rows[:1], warmup_rows=0) is None
    assert steady_rate(rows, warmup_rows=10) is None


def test_read_step_times_keeps_the_last_fit(tmp_path):
    path = tmp_path / "step_times.csv"
    path.write_text("step,fit_seconds,tokens\n1,5.0,10\n2,6.0,20\n3,2.0,10\n4,3.0,20\n")  # resumed at step 2
    assert read_step_times(path) == [(3, 2.0, 10), (4, 3.0, 20)]


def test_the_module_and_the_step_times_log_the_same_steps():
    """One rule: the optimizer step that brings the count to a multiple of log_every_steps is logged."""
    assert [steps for steps in range(12) if is_logged_step(steps, 5)] == [5, 10]
    assert [steps for steps in range(3) if is_logged_step(steps, 0)] == [1, 2]  # 0 logs every step
