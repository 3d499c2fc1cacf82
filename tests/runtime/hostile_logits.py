"""Draft logits broken on purpose: NaN rows and entries, +inf, all -inf and far out of scale, as a corrupt or
diverged draft gives them; the runtime must stay the target's output whatever a draft writes."""
import torch

BROKEN = ("nan_row", "nan_entry", "posinf", "all_neginf", "huge")


def break_rows(logits: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """logits [r, Vd] with about half of the rows broken, each in one of the BROKEN ways."""
    logits = logits.clone()
    for row in range(logits.shape[0]):
        if torch.rand((), generator=generator) < 0.5:
            continue
        how = BROKEN[int(torch.randint(len(BROKEN), (), generator=generator))]
        column = int(torch.randint(logits.shape[1], (), generator=generator))
        if how == "nan_row":
            logits[row] = float("nan")
        elif how == "nan_entry":
            logits[row, column] = float("nan")
        elif how == "posinf":
            logits[row, column] = float("inf")
        elif how == "all_neginf":
            logits[row] = float("-inf")
        else:  # finite, but far out of scale: a draft that names one garbage token with certainty
            logits[row, column] = 1e30
    return logits
