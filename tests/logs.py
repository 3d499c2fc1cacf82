"""Reading a captured log as a user would see it: what a terminal shows of it, and what in it a user should not
see (test_console.py checks the checker; test_smoke_smollm2.py checks the smoke path's whole log with it)."""
import re

ADVERTS = ("💡 Tip", "litlogger", "litmodels", "Lightning Experiments")
LOG_RECORD = re.compile(r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)(?: [\w.]+)?: ")
"""The start of a log record, as specdraft (`INFO name: `) and Lightning (`INFO: `) format them."""
BAR = re.compile(r"\d+%\||\| *[\d.]+[kMG]?/\S+ \[|\[\d\d:\d\d|… \d\d:\d\d")
"""Something only a progress bar draws: `42%|`, `| 3/24 [`, `[00:12`, a loading line's `… 00:12`."""


def visible_lines(log: str) -> list:
    """The lines a terminal shows of a log: each line's last carriage-return segment, cursor moves removed."""
    lines = [re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", line).split("\r")[-1].strip() for line in log.split("\n")]
    return [line for line in lines if line]


def log_problems(log: str) -> list:
    """What a user should not see: tracebacks, repeated lines, adverts, DeepSpeed's guess, library deprecations."""
    lines = visible_lines(log)
    problems = [f"repeated: {line}" for index, line in enumerate(lines)
                if line in lines[:index] and not finished_bar_redrawn(lines, index) and not bar_redrawn(lines, index)]
    problems += [f"traceback: {line}" for line in lines if line.startswith("Traceback")]
    problems += [f"advert: {line}" for line in lines if any(advert in line for advert in ADVERTS)]
    problems += [f"dependency note: {line}" for line in lines
                 if "Setting accelerator to CPU" in line or re.search(r"site-packages/.*(deprecated|Warning)", line)]
    problems += [f"accelerator census: {line}" for line in lines if re.match(r"(INFO: )?[GTHI]PU available: ", line)]
    problems += [f"log line inside a bar: {line}" for line in lines if log_inside_a_bar(line)]
    return problems


def log_inside_a_bar(line: str) -> bool:
    """Whether a visible line is a bar's (or a loading line's) frame with a log record written onto its end: the
    record was printed while the bar held the line, not through the bar's writer."""
    record = LOG_RECORD.search(line)
    return record is not None and record.start() > 0 and BAR.search(line[:record.start()]) is not None


def finished_bar_redrawn(lines: list, index: int) -> bool:
    """Whether line `index` is a finished progress bar drawn again right below itself: tqdm's close redraws its
    last state, on a line of its own when the stream is not a terminal and that state was already printed
    (seen once in a slow CI run: `eval: 100%|...| 3/3` twice). Any other repeat is a problem."""
    return index > 0 and lines[index] == lines[index - 1] and re.search(r": 100%\|.*\| (\d+)/\1 \[", lines[index])


def bar_redrawn(lines: list, index: int) -> bool:
    """Whether line `index` is an open (unfinished) bar's frame drawn again below a line written through the bar:
    tqdm.write clears the bar, writes the line and draws the bar anew, which a file keeps as the same frame twice
    around the line. A finished bar is closed, never redrawn so: its repeat stays a problem (a second run's bar)."""
    line = lines[index]
    return (index >= 2 and lines[index - 2] == line != lines[index - 1] and BAR.search(line) is not None
            and not re.search(r"\| (\d+)/\1 \[", line))
