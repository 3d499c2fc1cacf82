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
FEW_CYCLES = 10
"""A rate over fewer cycles than this is drawn hollow: one cycle's 1.0 is not a rate."""


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


def rate_label(rate: float, cycles: Optional[int]) -> str:
    """A rate as the plots write it (two decimals) with the cycles it is taken over."""
    return f"{rate:.2f}" + ("" if cycles is None else f"\nn={cycles}")


def acceptance_panel(ax, rates: Sequence[float], cycles: Optional[Sequence[int]], bars: bool = True,
                     label: Optional[str] = None, color: Optional[str] = None, below: bool = False,
                     tag: str = "") -> None:
    """Acceptance by draft position on `ax`: bars (or a line) at the positions some cycle reached (`cycles`: how
    many reached each; None: all), each labelled with its rate and its cycles (a rate over 1 cycle is not a rate
    over 80; a line's points over fewer than FEW_CYCLES drawn hollow, off the line), a rate of 0 drawn as a mark on
    the axis,
    'no data' written where no cycle reached a position (`tag` first, e.g. the run's temperature, where several
    lines share the axes), integer ticks, the rate's axis 0..1 with room for the labels. `below`: a line's labels
    under its points (a second line on the same axes)."""
    positions = list(range(1, len(rates) + 1))
    seen = [p for p in positions if cycles is None or cycles[p - 1] > 0]
    values = [rates[p - 1] for p in seen]
    counts = [None if cycles is None else cycles[p - 1] for p in seen]
    if bars:
        drawn = ax.bar(seen, values, width=0.8, label=label, color=color)
        color = drawn.patches[0].get_facecolor() if drawn.patches else color
        zeros = [p for p, v in zip(seen, values) if v == 0]
        ax.plot(zeros, [0] * len(zeros), linestyle="none", marker="_", markersize=40, markeredgewidth=4,
                color=color, clip_on=False)  # a bar of height 0 is no bar: its mark says "measured, none accepted"
        for position, value, count in zip(seen, values, counts):
            ax.text(position, value + 0.02, rate_label(value, count), ha="center", va="bottom", fontsize=8)
    else:
        few = [(p, v) for p, v, n in zip(seen, values, counts) if n is not None and n < FEW_CYCLES]
        solid = [(p, v) for p, v in zip(seen, values) if (p, v) not in few]
        line, = ax.plot([p for p, _ in solid], [v for _, v in solid], marker="o", label=label, color=color)
        color = line.get_color()  # the line joins the rates over many cycles; a few cycles' rate stands apart
        ax.plot([p for p, _ in few], [v for _, v in few], linestyle="none", marker="o", markerfacecolor="white",
                color=color, zorder=line.get_zorder() + 1, clip_on=False)
        for position, value, count in zip(seen, values, counts):
            ax.annotate(rate_label(value, count), (position, value), textcoords="offset points",
                        xytext=(0, -10 if below else 6), ha="center", va="top" if below else "bottom", fontsize=7,
                        color=color)
    for position in positions:
        if position not in seen:
            ax.text(position, 0.03, f"{tag}{': ' if tag else ''}no data", ha="center", va="bottom", rotation=90,
                    fontsize=8, color=color if tag else "grey")
    ax.set_xticks(positions)
    ax.set_xlim(0.4, len(rates) + 0.6)
    ax.set_xlabel(POSITION_LABEL)
    ax.set_ylabel(RATE_LABEL)
    ax.set_ylim(0, 1.18)  # labels above a rate of 1 stay inside
    ax.set_yticks([0, 0.2, 0.4, 0.6, 0.8, 1.0])


def speed_label(value: float) -> str:
    """A speed as every bar writes it: three significant digits, no exponent (2,619 / 72.4 / 1.68 / 0.482)."""
    magnitude = abs(value)
    decimals = 0 if magnitude >= 100 else 1 if magnitude >= 10 else 2 if magnitude >= 1 else 3
    return f"{value:,.{decimals}f}"


def _speed_panel(ax, runs: List[dict]) -> None:
    """Tokens/s of Hugging Face generate, plain decoding and speculative decoding, one bar group a temperature,
    every bar labelled in one number format."""
    names = ["HF generate", "plain (this runtime)", "speculative"]
    width = 0.8 / len(runs)
    for index, run in enumerate(runs):
        values = [run["tokens_per_s_hf"], run["tokens_per_s_plain"], run["tokens_per_s"]]
        xs = [x + (index - (len(runs) - 1) / 2) * width for x in range(3)]
        kept = [(x, v) for x, v in zip(xs, values) if v is not None]  # no HF bar when it was not run
        drawn = ax.bar([x for x, _ in kept], [v for _, v in kept], width=width, label=f"T={run['temperature']:g}")
        ax.bar_label(drawn, labels=[speed_label(v) for _, v in kept], fontsize=7)
    if all(run["tokens_per_s_hf"] is None for run in runs):
        ax.text(0, 0.03, "not run\n(--no-hf)", ha="center", va="bottom", fontsize=8, color="grey",
                transform=ax.get_xaxis_transform())  # x in data, y in axes units
    ax.set_xticks(range(3), names)
    ax.set_xlim(-0.6, 2.6)
    ax.margins(y=0.12)
    ax.set_ylabel("decoding speed (tokens/s)")
    ax.set_title("speed", fontsize=9)
    ax.legend(fontsize=8)


def bench_title(settings: dict, prompts: int) -> str:
    """What bench.png shows: the draft (method, export), the target, the prompts and the device."""
    return (f"specdraft bench: {settings['method']} draft {draft_name(settings['draft'])} on "
            f"{short_path(settings['target'], 1)}\n{prompts} prompts of {short_path(settings['prompts'], 1)}, "
            f"{settings['max_new_tokens']} new tokens each, {settings['device']} ({settings['dtype']})")


def lossless_title(report: dict) -> str:
    """What the bench compared for losslessness, for the plot's title: the float32 check and the timed run's own
    dtype's comparison, each with its prompts ('not checked' when neither ran)."""
    dtype = report["settings"]["dtype"]
    parts = []
    check = report.get("float32_check")
    if check is not None:
        parts.append(f"lossless in float32: {'yes' if check['lossless'] else 'NO'} "
                     f"({check['identical']}/{check['prompts']} prompts identical to plain decoding)")
    own = report.get(f"{dtype}_matches_plain")
    if own is not None and not (dtype == "float32" and check is not None and check.get("reused_timed_run")):
        parts.append(f"{dtype}: {own} identical to plain")
    return "; ".join(parts) or "lossless: not checked (no T=0 run, --lossless-prompts 0)"


def has_verify_curve(report: dict) -> bool:
    """Whether τ against the tokens verified a cycle is a curve: a prune sweep's rows (the unpruned tree and at
    least one β). Without one it would be a point or two on axes scaled to them (each temperature's tree), so
    bench.png leaves it out."""
    return len(report.get("prune_sweep") or []) >= 2


def plot_bench(report: dict, path: Path) -> None:
    """bench.png: tokens/s against plain decoding and HF generate, acceptance by draft position, with a prune sweep
    τ against the tokens verified a cycle, and with a judge's δ sweep τ and retained accuracy against δ; the title
    says what was compared for losslessness."""
    plt = pyplot()
    runs = report["runs"]
    judged = bool(report.get("judge_sweep"))
    curve = has_verify_curve(report)
    count = 2 + curve + judged
    fig, axes = plt.subplots(1, count, figsize=(5 * count + 0.5, 4.8))
    speed_ax, accept_ax = axes[:2]
    _speed_panel(speed_ax, runs)
    for index, run in enumerate(runs):
        acceptance_panel(accept_ax, run["acceptance_by_position"], run.get("cycles_by_position"), bars=False,
                         label=f"T={run['temperature']:g}, τ={run['tau']:.2f} tokens/cycle", below=index % 2 == 1,
                         tag=f"T={run['temperature']:g}" if len(runs) > 1 else "")
    accept_ax.set_title(f"acceptance (n: cycles each rate is over; hollow: n < {FEW_CYCLES})", fontsize=9)
    accept_ax.legend(fontsize=8, loc="upper right")
    if curve:
        _verified_panel(axes[2], report)
    if judged:
        _judge_panel(axes[-1], report)
    fig.suptitle(bench_title(report["settings"], runs[0]["prompts"]) + "\n" + lossless_title(report) +
                 ("; judged runs: lossless: false" if judged else ""), fontsize=9)
    fig.tight_layout()
    save_figure(fig, path)


def _judge_panel(ax, report: dict) -> None:
    """τ and retained accuracy against the judge's δ, the exact greedy run's τ as a line."""
    sweep = report["judge_sweep"]
    thresholds = [run["judge_threshold"] for run in sweep]
    exact = next((run for run in report["runs"] if run["temperature"] == 0), None)
    ax.plot(thresholds, [run["tau"] for run in sweep], marker="o", label="τ (judged)")
    if exact is not None:
        ax.axhline(exact["tau"], linestyle="--", color="grey", label=f"τ exact {exact['tau']:.2f}")
    ax.set_xlabel("judge threshold δ")
    ax.set_ylabel("τ (tokens per cycle)")
    ax.set_title("judged acceptance (lossless: false)", fontsize=9)
    retained = [(run.get("answers") or {}).get("retained_accuracy") for run in sweep]
    if any(value is not None for value in retained):
        quality = ax.twinx()
        quality.plot(thresholds, [float("nan") if v is None else v for v in retained], marker="s", color="tab:red",
                     label="retained accuracy")
        quality.set_ylabel("retained accuracy (share of plain decoding's solved prompts)")
        quality.set_ylim(0, 1.05)
        quality.legend(loc="lower right", fontsize=8)
    ax.legend(loc="upper right", fontsize=8)


def _verified_panel(ax, report: dict) -> None:
    """τ against the tokens verified per cycle over a tree scorer's β sweep: one curve through its rows by verify
    cost, each pruned point labelled with its β, the unpruned tree marked."""
    sweep = sorted(report["prune_sweep"], key=lambda run: run["verified_per_cycle"])
    line, = ax.plot([r["verified_per_cycle"] for r in sweep], [r["tau"] for r in sweep], marker="o",
                    label="pruned (β)")
    for run in sweep:
        if run["prune_threshold"] is None:
            ax.scatter([run["verified_per_cycle"]], [run["tau"]], marker="s", s=60, color=line.get_color(),
                       label="unpruned", zorder=3)
        else:
            ax.annotate(f"β={run['prune_threshold']:g}", (run["verified_per_cycle"], run["tau"]),
                        textcoords="offset points", xytext=(4, -10), fontsize=7)
    ax.margins(x=0.08, y=0.15)
    ax.set_xlabel("tokens verified per cycle (root included)")
    ax.set_ylabel("τ (tokens per cycle)")
    ax.set_title("τ against verify cost", fontsize=9)
    ax.legend(fontsize=8)
