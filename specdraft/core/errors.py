"""User-facing errors: one line, the bad value named, exit code 2 from the CLI."""


class SpecdraftError(Exception):
    """A problem with the user's input (recipe, files, target). The CLI prints it on one line and exits 2."""


def choices_error(what: str, value, valid) -> SpecdraftError:
    """`unknown <what> 'value'; valid: a, b, c`."""
    return SpecdraftError(f"unknown {what} {value!r}; valid: {', '.join(map(str, valid))}")


def error_summary(err: BaseException, prefer: str = "") -> str:
    """`ErrorType: its first non-empty line` (or its first line containing `prefer`, when one does): libraries
    write several lines, and the CLI prints one."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    chosen = next((line for line in lines if prefer and prefer in line), lines[0] if lines else "")
    return f"{type(err).__name__}: {chosen}"[:500]


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, caught by a stage that can say what it kept and how to go on. The CLI prints the message on one line
    (`specdraft <command>: interrupted: ...`) and exits 130; every stage writes its files whole or not at all."""
