"""User-facing errors: one line, the bad value named, exit code 2 from the CLI."""


class SpecdraftError(Exception):
    """A problem with the user's input (recipe, files, target). The CLI prints it on one line and exits 2."""


def choices_error(what: str, value, valid) -> SpecdraftError:
    """`unknown <what> 'value'; valid: a, b, c`."""
    return SpecdraftError(f"unknown {what} {value!r}; valid: {', '.join(map(str, valid))}")


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, caught by a stage that can say what it kept and how to go on. The CLI prints the message on one line
    (`specdraft <command>: interrupted: ...`) and exits 130; every stage writes its files whole or not at all."""
