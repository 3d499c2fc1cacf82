"""User-facing errors: one line, the bad value named, exit code 2 from the CLI. A value read from a file is shown only
when it is a short name (`shown`): an error never prints a file's contents (a recipe linked to /etc/passwd)."""
import re

NAME = re.compile(r"[A-Za-z0-9_.+\-/]{1,64}")
"""What a message shows of a value as it is: a key, a choice, a number, a path of plain characters."""


class SpecdraftError(Exception):
    """A problem with the user's input (recipe, files, target). The CLI prints it on one line and exits 2."""


def shown(value) -> str:
    """A value as an error message shows it: numbers, None and short names as they are; anything else described by
    its type and length, never quoted (it may be a file's contents)."""
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)
    if isinstance(value, str) and NAME.fullmatch(value):
        return repr(value)
    return f"(a {type(value).__name__} of {len(str(value))} characters, not a name)"


def choices_error(what: str, value, valid) -> SpecdraftError:
    """`unknown <what> 'value'; valid: a, b, c`."""
    return SpecdraftError(f"unknown {what} {shown(value)}; valid: {', '.join(map(str, valid))}")


def error_summary(err: BaseException, prefer: str = "") -> str:
    """`ErrorType: its first non-empty line` (or its first line containing `prefer`, when one does): libraries
    write several lines, and the CLI prints one."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    chosen = next((line for line in lines if prefer and prefer in line), lines[0] if lines else "")
    return f"{type(err).__name__}: {chosen}"[:500]


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, caught by a stage that can say what it kept and how to go on. The CLI prints the message on one line
    (`specdraft <command>: interrupted: ...`) and exits 130; every stage writes its files whole or not at all."""
