"""The evaluation plot: acceptance by draft position, with τ, the draft, the prompts and the device in the title."""
from __future__ import annotations

from pathlib import Path

from specdraft.runtime.plots import acceptance_panel, draft_name, pyplot, save_figure, short_path


def eval_title(report: dict) -> str:
    settings = report["settings"]
    return (f"specdraft eval: {settings['method']} draft {draft_name(settings['draft'])}, "
            f"τ = {report['tau']:.2f} tokens/cycle\nchain of {settings['depth']}, T=0, "
            f"{report['prompts']} prompts of {short_path(settings['prompts'], 1)}, {settings.get('device', '?')}")


def plot_acceptance(report: dict, path: Path) -> None:
    """eval.png: a bar a draft position that some cycle reached."""
    fig, ax = pyplot().subplots(figsize=(6.5, 4))
    acceptance_panel(ax, report["acceptance_by_position"], report.get("cycles_by_position"), color="#3b7dd8")
    ax.set_title(eval_title(report), fontsize=9)
    fig.tight_layout()
    save_figure(fig, path)
