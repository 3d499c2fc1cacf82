"""The CLI explains itself: every command listed, every argument of every command with help, each command's help
ending with a typical invocation that parses, and a command missing what it needs saying so. CPU, no model."""
import argparse
import shlex

import pytest

from specdraft import cli

COMMANDS = ("distill-data", "train", "export", "eval", "generate", "bench", "slurm", "build-small-vlm")


def subcommands(parser: argparse.ArgumentParser) -> dict:
    """{name: parser} of the parser's subcommands."""
    actions = [a for a in parser._actions if isinstance(a.choices, dict)]  # argparse keeps them in its subparsers
    return {name: sub for action in actions for name, sub in action.choices.items()}


def walk(parser: argparse.ArgumentParser, prefix: str = "specdraft"):
    """(command, parser) for the parser and every subcommand below it."""
    yield prefix, parser
    for name, sub in subcommands(parser).items():
        yield from walk(sub, f"{prefix} {name}")


def test_every_command_is_listed_in_the_top_help():
    parser = cli.build_parser()
    assert tuple(subcommands(parser)) == COMMANDS
    text = parser.format_help()
    assert all(f"    {name}" in text for name in COMMANDS)
    assert "New knobs" not in text and "recipe dataclasses" not in text  # no developer note
    assert "specdraft distill-data recipes/" in text and "specdraft bench" in text  # the path, in its epilogue


def test_every_argument_of_every_command_has_help():
    missing = [f"{command}: {action.dest}" for command, parser in walk(cli.build_parser())
               for action in parser._actions
               if action.dest != "help" and not (action.help or "").strip()]
    assert not missing, f"arguments without help: {missing}"


@pytest.mark.parametrize("name", COMMANDS)
def test_each_command_ends_its_help_with_an_example_that_parses(name):
    sub = subcommands(cli.build_parser())[name]
    assert sub.epilog and sub.epilog.startswith("example:\n  specdraft ")
    example = shlex.split(sub.epilog.splitlines()[1])
    args = cli.build_parser().parse_args(example[1:])
    assert args.command == name and callable(args.func)
    assert sub.description  # what the command does, above its arguments


@pytest.mark.parametrize("argv, needs", [(["train"], "RECIPE"), (["distill-data"], "RECIPE"),
                                          (["export"], "RUN_DIR"), (["eval"], "DRAFT_DIR"),
                                          (["generate", "x"], "--prompt")])
def test_a_command_without_what_it_needs_says_what_it_needs(argv, needs, capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(argv)
    assert stop.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert needs in error and "overrides" not in error and "KEY=VALUE" not in error
    assert f"(e.g. specdraft {argv[0]} " in error  # the typical invocation, on the error's line


def test_bench_and_eval_write_beside_the_draft_by_default():
    parser = cli.build_parser()
    for argv in (["bench", "EXPORT"], ["eval", "EXPORT"]):
        assert parser.parse_args(argv).out is None  # None: the draft's directory (run_eval, _bench)
