"""The evaluation plot: acceptance by draft position, with τ in the title."""
from __future__ import annotations

from pathlib import Path


def plot_acceptance(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = report["acceptance_by_position"]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(range(1, len(rates) + 1), rates, color="#3b7dd8")
    ax.set_xlabel("draft position")
    ax.set_ylabel("P(accepted | earlier accepted)")
    ax.set_ylim(0, 1)
    settings = report["settings"]
    ax.set_title(f"{settings['method']}  τ = {report['tau']:.2f}  (chain of {settings['num_draft_tokens']}, T=0, "
                 f"{report['prompts']} prompts)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
