"""Every value a recipe or a flag takes is checked where it is parsed: a count of 0, a negative rate, a NaN is one
line naming the key, exit 2, before anything loads or is written. CPU, no model built."""
import pytest

from specdraft import cli
from tests.test_hostile_files import one_line_error
from tests.test_train_export_eval import make_recipe


@pytest.mark.parametrize("override, message", [
    ("train.micro_batch_size=0", "train.micro_batch_size must be at least 1, got 0"),
    ("train.max_steps=-1", "train.max_steps must be at least 1, got -1"),
    ("train.max_steps=0", "train.max_steps must be at least 1, got 0"),
    ("train.accumulate_grad_batches=0", "train.accumulate_grad_batches must be at least 1"),
    ("train.val_every_steps=0", "train.val_every_steps must be at least 1"),
    ("train.log_every_steps=0", "train.log_every_steps must be at least 1"),
    ("train.warmup_steps=-3", "train.warmup_steps must be at least 0"),
    ("train.lr=nan", "train.lr must be a finite number > 0, got nan"),
    ("train.lr=-1", "train.lr must be a finite number > 0, got -1.0"),
    ("train.lr=inf", "train.lr must be a finite number"),
    ("train.grad_clip=nan", "train.grad_clip must be a finite number"),
    ("train.weight_decay=-0.1", "train.weight_decay must be a finite number >= 0"),
    ("train.seed=-1", "train.seed must be at least 0"),
    ("data.max_length=0", "data.max_length must be at least 2, got 0"),
    ("data.max_samples=0", "data.max_samples must be at least 1"),
    ("data.val_fraction=nan", "data.val_fraction must be in [0, 1)"),
    ("distill.temperature=nan", "distill.temperature must be a finite number"),
    ("distill.top_p=0", "distill.top_p must be in (0, 1], got 0.0"),
    ("distill.max_new_tokens=0", "distill.max_new_tokens must be at least 1"),
    ("eval.max_new_tokens=0", "eval.max_new_tokens must be at least 1, got 0"),
    ("eval.depth=0", "eval.depth must be at least 1, got 0"),
    ("eval.max_prompts=0", "eval.max_prompts must be at least 1"),
    ("eval.skip_prompts=-1", "eval.skip_prompts must be at least 0"),
    ("runtime.topk=0", "runtime.topk must be at least 1"),
    ("runtime.depth=-2", "runtime.depth must be at least 1"),
])
@pytest.mark.parametrize("command", ["train", "distill-data"])
def test_a_recipe_value_out_of_range(tmp_path, tiny_target_dir, distilled, capsys, override, message, command):
    recipe = make_recipe(tmp_path, tiny_target_dir, distilled, max_steps=2, val_every_steps=2)
    one_line_error(capsys, [command, recipe, override], message)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval.jsonl", "recipe.yaml"]


@pytest.mark.parametrize("argv, message", [
    (["generate", "DRAFT", "--prompt", "hi", "--temperature", "nan"], "--temperature: expected a finite number >= 0"),
    (["generate", "DRAFT", "--prompt", "hi", "--temperature", "-1"], "--temperature: expected a finite number >= 0"),
    (["generate", "DRAFT", "--prompt", "hi", "--max-new-tokens", "-5"], "--max-new-tokens: expected an integer of at "
                                                                         "least 1, got -5"),
    (["bench", "DRAFT", "--temperature", "0", "nan"], "--temperature: expected a finite number >= 0"),
    (["bench", "DRAFT", "--max-new-tokens", "0"], "--max-new-tokens: expected an integer of at least 1, got 0"),
    (["bench", "DRAFT", "--max-prompts", "0"], "--max-prompts: expected an integer of at least 1"),
])
def test_a_flag_value_out_of_range(tmp_path, capsys, argv, message):
    argv = [str(tmp_path) if a == "DRAFT" else a for a in argv]
    with pytest.raises(SystemExit) as stopped:
        cli.main(argv)
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if ": error: " in line]
    assert stopped.value.code == 2 and len(errors) == 1 and "Traceback" not in err and message in errors[0], err
