"""The CLI explains itself: every command listed, every argument of every command with help, each command's help
ending with a typical invocation that parses, and a command missing what it needs saying so. It answers a bad
choice at once: `import specdraft.cli` imports no torch, argparse holds every choice, a recipe's keys and types are
checked before a stage's heavy imports. CPU, no model."""
import argparse
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

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
    examples = [shlex.split(line) for line in sub.epilog.splitlines() if line.startswith("  specdraft ")]
    for example in examples:  # the typical invocation, then any other (bench: one sized for a CPU)
        args = cli.build_parser().parse_args(example[1:])
        assert args.command == name and callable(args.func)
    assert sub.description  # what the command does, above its arguments


def test_bench_help_gives_a_cpu_sized_example():
    epilog = subcommands(cli.build_parser())["bench"].epilog
    assert cli.CPU_BENCH in epilog and "--device cpu" in cli.CPU_BENCH and "--no-hf" in cli.CPU_BENCH
    args = cli.build_parser().parse_args(shlex.split(cli.CPU_BENCH)[1:])
    assert args.dtype == "float32" and args.temperature == [0.0] and args.profile_cycles < 16


def test_version(capsys):
    from specdraft import __version__

    with pytest.raises(SystemExit) as stop:
        cli.main(["--version"])
    assert stop.value.code == 0 and capsys.readouterr().out.strip() == f"specdraft {__version__}"


def test_the_export_formats_are_those_the_methods_write():
    from specdraft.methods import METHODS

    assert set(cli.EXPORT_FORMATS) == {fmt for spec in METHODS.values() for fmt in spec.exports}


REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "lightning", "transformers", "deepspeed", "specdraft.methods", "data_gen")
PROBE = """
import sys
from specdraft import cli
try:
    code = cli.main(sys.argv[1:])
except SystemExit as stop:
    code = stop.code
print("heavy:", sorted(m for m in {heavy} if m in sys.modules), file=sys.stderr)
sys.exit(code)
""".format(heavy=HEAVY)


def specdraft(*argv, probe=False):
    """`specdraft ARGV` in a fresh interpreter -> (the finished process, its wall seconds)."""
    command = [sys.executable, "-c", PROBE, *argv] if probe else [sys.executable, "-m", "specdraft.cli", *argv]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    return done, time.perf_counter() - started


def test_importing_the_cli_imports_no_torch():
    done = subprocess.run([sys.executable, "-c", f"import sys, specdraft.cli; print([m for m in {HEAVY} "
                                                 f"if m in sys.modules])"],
                          capture_output=True, text=True, timeout=300, cwd=REPO, env={**os.environ,
                                                                                      "PYTHONPATH": str(REPO)})
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr[-2000:]


def test_an_unknown_export_format_is_refused_at_once(tmp_path):
    done, seconds = specdraft("export", str(tmp_path), "--format", "onnx", "--out", str(tmp_path / "x"))
    assert done.returncode == 2 and "invalid choice: 'onnx' (choose from 'hf', 'speculators')" in done.stderr
    assert seconds < 2.0, f"{seconds:.1f} s to refuse a format"
    assert not (tmp_path / "x").exists() and done.stdout == ""


@pytest.mark.parametrize("argv, message", [
    (["train", "recipes/smoke/eagle3_smollm2.yaml", "train.max_steps=abc"], "bad value for train.max_steps"),
    (["distill-data", "recipes/smoke/eagle3_smollm2.yaml", "distill.nope=1"], "unknown recipe key 'distill.nope'"),
    (["train", "recipes/smoke/eagle3_smollm2.yaml", "train.strategy=zero9"], "unknown train.strategy 'zero9'"),
    (["train", "recipes/smoke/eagle3_smollm2.yaml", "extra.x=1"], "unknown recipe section 'extra'"),
    (["eval", "runs/nope"], "runs/nope does not exist"),
    (["bench", "runs/nope"], "runs/nope does not exist"),
    (["generate", "runs/nope", "--prompt", "hi"], "runs/nope does not exist"),
    (["export", "runs/nope", "--out", "x"], "runs/nope does not exist"),
])
def test_a_bad_value_fails_before_the_heavy_imports(argv, message):
    done, _ = specdraft(*argv, probe=True)
    assert done.returncode == 2 and message in done.stderr, done.stderr[-2000:]
    assert "heavy: []" in done.stderr  # refused with no torch, Lightning, Transformers or method imported


def test_an_eval_override_is_checked_against_the_drafts_recipe(tmp_path):
    (tmp_path / "recipe.yaml").write_text((REPO / "recipes/smoke/eagle3_smollm2.yaml").read_text())
    done, _ = specdraft("eval", str(tmp_path), "eval.max_prompts=many", probe=True)
    assert done.returncode == 2 and "bad value for eval.max_prompts" in done.stderr and "heavy: []" in done.stderr


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
