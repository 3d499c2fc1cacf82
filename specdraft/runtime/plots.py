"""Plots of decoding reports that stand alone: a title naming the draft, the prompts and the device, axes with
units, integer draft positions, and no bar or point where no cycle reached a position (no data is not a rate of
0). `plot_bench` draws bench.png; specdraft/eval/plot.py draws eval.png with the same parts."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Sequence

import torch

from specdraft.core.io import atomic_file

POSITION_LABEL = "draft position (1 = first token after the verified prefix)"
RATE_LABEL = "P(accepted | earlier accepted)"


def device_name(device: torch.device) -> str:
    """The device a report names: the GPU's model, or cpu."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def short_path(path: str, parts: int = 2) -> str:
    """The last `parts` components of a path (runs/eagle3_smollm2/export -> eagle3_smollm2/export)."""
    return "/".join(Path(path).parts[-parts:]) if path else "?"


def draft_name(source: str) -> str:
    """A draft by its directory: an export's (eagle3_smollm2/export) or a run's snapshot (NAME/train/best)."""
    directory = Path(source).parent if Path(source).suffix else Path(source)
    return short_path(str(directory), 3 if directory.name in ("best", "last") else 2)


def pyplot():
    """matplotlib's pyplot on the file-only backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path, dpi: int = 110) -> None:
    """Write the figure whole or not at all (a Ctrl-C leaves no half-written PNG), then free it."""
    with atomic_file(path) as tmp:
        fig.savefig(tmp, dpi=dpi, format="png")
    pyplot().close(fig)


def acceptance_panel(ax, rates: Sequence[float], cycles: Optional[Sequence[int]], bars: bool = True,
                     label: Optional[str] = None, color: Optional[str] = None) -> None:
    """Acceptance by draft position on `ax`: bars (or a line) at the positions some cycle reached (`cycles`: how
    many reached each; None: all), 'no data' written where none did, integer ticks, the rate's axis 0..1."""
    positions = list(range(1, len(rates) + 1))
    seen = [p for p in positions if cycles is None or cycles[p - 1] > 0]
    values = [rates[p - 1] for p in seen]
    if bars:
        ax.bar(seen, values, width=0.8, label=label, color=color)
    else:
        ax.plot(seen, values, marker="o", label=label, color=color)
    for position in positions:
        if position not in seen:
            ax.text(position, 0.03, "no data", ha="center", va="bottom", rotation=90, fontsize=8, color="grey")
    ax.set_xticks(positions)
    ax.set_xlim(0.4, len(rates) + 0.6)
    ax.set_xlabel(POSITION_LABEL)
    ax.set_ylabel(RATE_LABEL)
    ax.set_ylim(0, 1)


def _speed_panel(ax, runs: List[dict]) -> None:
    """Tokens/s of Hugging Face generate, plain decoding and speculative decoding, one bar group a temperature."""
    names = ["HF generate", "plain (this runtime)", "speculative"]
    width = 0.8 / len(runs)
    for index, run in enumerate(runs):
        values = [run["tokens_per_s_hf"], run["tokens_per_s_plain"], run["tokens_per_s"]]
        xs = [x + (index - (len(runs) - 1) / 2) * width for x in range(3)]
        kept = [(x, v) for x, v in zip(xs, values) if v is not None]  # no HF bar when it was not run
        drawn = ax.bar([x for x, _ in kept], [v for _, v in kept], width=width, label=f"T={run['temperature']:g}")
        ax.bar_label(drawn, fmt="%.3g", fontsize=7)
    if all(run["tokens_per_s_hf"] is None for run in runs):
        ax.text(0, 0.03, "not run\n(--no-hf)", ha="center", va="bottom", fontsize=8, color="grey",
                transform=ax.get_xaxis_transform())  # x in data, y in axes units
    ax.set_xticks(range(3), names)
    ax.set_xlim(-0.6, 2.6)
    ax.set_ylabel("decoding speed (tokens/s)")
    ax.set_title("speed", fontsize=9)
    ax.legend(fontsize=8)


def bench_title(settings: dict, prompts: int) -> str:
    """What bench.png shows: the draft (method, export), the target, the prompts and the device."""
    return (f"specdraft bench: {settings['method']} draft {draft_name(settings['draft'])} on "
            f"{short_path(settings['target'], 1)}\n{prompts} prompts of {short_path(settings['prompts'], 1)}, "
            f"{settings['max_new_tokens']} new tokens each, {settings['device']} ({settings['dtype']})")


def plot_bench(report: dict, path: Path) -> None:
    """bench.png: tokens/s against plain decoding and HF generate, acceptance by draft position, and τ against the
    tokens verified a cycle."""
    plt = pyplot()
    runs = report["runs"]
    fig, (speed_ax, accept_ax, verified_ax) = plt.subplots(1, 3, figsize=(15, 4.5))
    _speed_panel(speed_ax, runs)
    for run in runs:
        acceptance_panel(accept_ax, run["acceptance_by_position"], run.get("cycles_by_position"), bars=False,
                         label=f"T={run['temperature']:g}, τ={run['tau']:.2f} tokens/cycle")
    accept_ax.set_title("acceptance", fontsize=9)
    accept_ax.legend(fontsize=8)
    _verified_panel(verified_ax, report)
    fig.suptitle(bench_title(report["settings"], runs[0]["prompts"]), fontsize=9)
    fig.tight_layout()
    save_figure(fig, path)


def _verified_panel(ax, report: dict) -> None:
    """τ against the tokens verified per cycle: a tree scorer's β sweep as a curve (the unpruned tree marked), else
    each temperature's run as a point."""
    sweep = report.get("prune_sweep") or []
    pruned = [run for run in sweep if run["prune_threshold"] is not None]
    if pruned:
        ax.plot([r["verified_per_cycle"] for r in pruned], [r["tau"] for r in pruned], marker="o", label="pruned")
        for run in pruned:
            ax.annotate(f"β={run['prune_threshold']:g}", (run["verified_per_cycle"], run["tau"]), fontsize=7)
    points = [run for run in sweep if run["prune_threshold"] is None] or report["runs"]
    for run in points:
        label = "unpruned" if sweep else f"T={run['temperature']:g}"
        ax.scatter([run["verified_per_cycle"]], [run["tau"]], marker="s" if sweep else "o", label=label, zorder=3)
    ax.set_xlabel("tokens verified per cycle (root included)")
    ax.set_ylabel("τ (tokens per cycle)")
    ax.set_title("τ against verify cost", fontsize=9)
    ax.legend(fontsize=8)
