"""The evaluation plot: acceptance by draft position, each bar with its rate and the cycles it is over, with τ,
the lossless check, the draft, the prompts and the device in the title."""
from __future__ import annotations

from pathlib import Path

from specdraft.runtime.plots import acceptance_panel, draft_name, pyplot, save_figure, short_path


def eval_title(report: dict) -> str:
    settings = report["settings"]
    identical = report.get("lossless_prompts")
    lossless = "lossless: " + ("yes" if report.get("lossless") else "NO") + \
        (f" ({identical}/{report['prompts']} answers identical to the target's greedy ones)"
         if identical is not None else "")
    return (f"specdraft eval: {settings['method']} draft {draft_name(settings['draft'])}, "
            f"τ = {report['tau']:.2f} tokens/cycle\nchain of {settings['depth']}, T=0, "
            f"{report['prompts']} prompts of {short_path(settings['prompts'], 1)}, {settings.get('device', '?')} "
            f"({settings.get('dtype', '?')})\n{lossless}")


def plot_acceptance(report: dict, path: Path) -> None:
    """eval.png: a bar a draft position that some cycle reached, labelled with its rate and cycles."""
    fig, ax = pyplot().subplots(figsize=(6.5, 4.4))
    cycles = report.get("cycles_by_position")
    acceptance_panel(ax, report["acceptance_by_position"], cycles, color="#3b7dd8")
    if cycles is not None:
        ax.text(0.01, 0.99, "n: cycles that reached the position (every earlier draft accepted)", fontsize=7,
                color="grey", ha="left", va="top", transform=ax.transAxes)
    ax.set_title(eval_title(report), fontsize=9)
    fig.tight_layout()
    save_figure(fig, path)
