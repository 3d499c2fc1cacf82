"""Every shipped recipe loads and validates; bad recipes fail with one line naming the key. CPU, no target."""
from pathlib import Path

import pytest

from specdraft.recipes import load_recipe, recipe_to_yaml
from specdraft.core.errors import SpecdraftError
from specdraft.methods import METHODS

RECIPES = sorted(Path(__file__).resolve().parents[1].joinpath("recipes").rglob("*.yaml"))
REQUIRED_KEYS = ["data.prompts", "data.max_samples", "distill.max_new_tokens", "distill.output_dir",
                 "train.max_steps", "train.output_dir", "eval.prompts", "eval.max_prompts", "eval.max_new_tokens"]


RECIPE_TARGETS = {"vispec": ("smallvlm", "llava16")}
"""A method's small and large targets where they are not SmolLM2 and Llama-3 (vision-language methods: the small VLM
`specdraft build-small-vlm` builds, and LLaVA-1.6)."""


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_has_its_recipes(method):
    small, large = RECIPE_TARGETS.get(method, ("smollm2", "llama3"))
    shipped = {p.name for p in RECIPES if p.parent.name == "recipes"}
    assert {f"{method}_{small}.yaml", f"{method}_{large}.yaml"} <= shipped
    assert f"{method}_{small}.yaml" in {p.name for p in RECIPES if p.parent.name == "smoke"}


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name if p.parent.name == "recipes" else f"smoke/{p.name}")
def test_recipe_loads_and_round_trips(path, tmp_path):
    recipe = load_recipe(path)
    assert recipe.method_name in METHODS
    for dotted in REQUIRED_KEYS:
        section, key = dotted.split(".")
        assert hasattr(getattr(recipe, section), key), dotted
    saved = tmp_path / "recipe.yaml"
    saved.write_text(recipe_to_yaml(recipe))
    assert load_recipe(saved) == recipe


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name if p.parent.name == "recipes" else f"smoke/{p.name}")
def test_every_shipped_recipe_trains_on_the_fast_path(path):
    """Compiled on CUDA (eager on a CPU), swiglu checkpointing, the fused 8-bit AdamW on CUDA (adamw on a CPU):
    the defaults (docs/benchmarks.md), which no shipped recipe turns off."""
    train = load_recipe(path).train
    assert (train.compile, train.activation_checkpointing, train.optimizer) == ("auto", "swiglu", "auto")


def _write(tmp_path, text):
    path = tmp_path / "r.yaml"
    path.write_text(text)
    return path


BASE = "method: {name: eagle3}\n"


@pytest.mark.parametrize("text, overrides, message", [
    (BASE + "train: {max_stepz: 3}\n", [], "unknown recipe key 'train.max_stepz'; valid keys in 'train': output_dir"),
    (BASE, ["method.ttt_stepz=3"], "unknown recipe key 'method.ttt_stepz'; valid keys in 'method': name, ttt_steps"),
    (BASE + "train: {max_steps: lots}\n", [], "train.max_steps"),
    ("method: {name: medusa}\n", [], "unknown method 'medusa'; valid: c2t, dflash, eagle3"),
    (BASE + "trainer: {}\n", [], "unknown recipe section 'trainer'; valid: target"),
    (BASE + "train: {strategy: fsdp9}\n", [], "unknown train.strategy 'fsdp9'; valid: auto, ddp, deepspeed_stage_1"),
    ("data: {}\n", [], "recipe has no method.name"),
    (BASE, ["train.max_steps"], "override 'train.max_steps' is not of the form key=value"),
    (BASE, ["train.shard_target=maybe"], "unknown train.shard_target 'maybe'; valid: auto, true, false"),
    (BASE, ["train.activation_checkpointing=mlp"], "unknown train.activation_checkpointing 'mlp'; valid: none, "
                                                   "swiglu, selective, full, false, true"),
    (BASE, ["train.optimizer=adam8"], "unknown train.optimizer 'adam8'; valid: auto, adamw, adamw8bit, adamw8bit_fused"),
    (BASE, ["train.compile=eager"], "unknown train.compile 'eager'; valid: auto, true, false"),
    (BASE + "train: {shard_target: true}\n", [], "train.shard_target=true partitions the target with ZeRO-3: "
                                                  "it needs train.strategy=deepspeed_stage_3, got auto"),
    (BASE + "train: {shard_target: true, strategy: deepspeed_stage_3}\n", ["data.features=hybrid"],
     "train.shard_target=true needs data.features=online"),
    (BASE + "data: {pack_length: 2048}\n", ["data.features=offline"],
     "data.pack_length packs conversations for data.features=online only (stored features are read per "
     "conversation); got data.features=offline"),
    (BASE + "train: {shard_target: true, strategy: deepspeed_stage_3}\n", ["target.quantization=4bit"],
     "train.shard_target=true cannot partition quantized weights (target.quantization=4bit)"),
    (BASE, ["train.prefetch_features=bogus"], "unknown train.prefetch_features 'bogus'; valid: auto, true, false"),
    (BASE, ["train.prefetch_start=soon"], "unknown train.prefetch_start 'soon'; valid: backward, gradients"),
    (BASE, ["train.prefetch_features=true", "data.features=offline"],
     "train.prefetch_features=true needs online features of a target held whole on each GPU (data.features=online, "
     "not train.shard_target's partitioned target, whose layers DeepSpeed's engine gathers with hooks inside the "
     "forward), got data.features=offline; set train.prefetch_features=auto or false"),
    (BASE + "train: {shard_target: true, strategy: deepspeed_stage_3}\n", ["train.prefetch_features=true"],
     "inside the forward), got train.shard_target=true; set train.prefetch_features=auto or false"),
    (BASE, ["train.prefetch_features=true", "train.cuda_graphs=true"],
     "train.prefetch_features=true needs a step outside CUDA graphs (train.cuda_graphs captures the step: its graph "
     "replays the target's forward itself), got train.cuda_graphs=true; set train.prefetch_features=auto or false"),
    (BASE, ["train.deepspeed.zero_optimization.reduce_bucket_size=5"],
     "train.deepspeed configures DeepSpeed: it needs a deepspeed_* train.strategy, got auto"),
])
def test_bad_recipes_name_the_problem(tmp_path, text, overrides, message):
    with pytest.raises(SpecdraftError) as err:
        load_recipe(_write(tmp_path, text), overrides)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("value, expected", [("true", "true"), ("False", "false"), ("auto", "auto")])
def test_shard_target_accepts_yaml_booleans(tmp_path, value, expected):
    text = BASE + f"train: {{shard_target: {value}, strategy: deepspeed_stage_3}}\n"
    assert load_recipe(_write(tmp_path, text)).train.shard_target == expected


@pytest.mark.parametrize("value, expected", [("true", "full"), ("false", "none"), ("False", "none"),
                                             ("selective", "selective"), ("swiglu", "swiglu"), ("full", "full")])
def test_activation_checkpointing_takes_a_mode_or_a_yaml_boolean(tmp_path, value, expected):
    text = BASE + f"train: {{activation_checkpointing: {value}}}\n"
    assert load_recipe(_write(tmp_path, text)).train.activation_checkpointing == expected


@pytest.mark.parametrize("value, expected", [("true", "true"), ("false", "false"), ("auto", "auto")])
def test_compile_accepts_yaml_booleans(tmp_path, value, expected):
    assert load_recipe(_write(tmp_path, BASE + f"train: {{compile: {value}}}\n")).train.compile == expected


@pytest.mark.parametrize("value, expected", [("true", "true"), ("False", "false"), ("auto", "auto")])
def test_prefetch_features_accepts_yaml_booleans(tmp_path, value, expected):
    text = BASE + f"train: {{prefetch_features: {value}}}\n"
    assert load_recipe(_write(tmp_path, text)).train.prefetch_features == expected


def test_missing_recipe_file(tmp_path):
    with pytest.raises(SpecdraftError, match="recipe file not found"):
        load_recipe(tmp_path / "nope.yaml")


def test_overrides_apply_and_types_coerce(tmp_path):
    recipe = load_recipe(_write(tmp_path, BASE), ["train.max_steps=7", "method.ttt_steps=2", "data.prompts=[a,b]"])
    assert recipe.train.max_steps == 7 and recipe.method.ttt_steps == 2 and recipe.data.prompts == ["a", "b"]


def test_recipe_reference_is_current():
    """docs/recipes.md is generated from the config dataclasses' field docstrings."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    result = subprocess.run([sys.executable, "-m", "tools.gen_recipe_reference", "--check"], cwd=root,
                            capture_output=True)
    assert result.returncode == 0, "docs/recipes.md is stale: run python -m tools.gen_recipe_reference"


def test_deepspeed_entries_merge_over_specdraft_s_config(tmp_path):
    """train.deepspeed overrides DeepSpeed's config key by key, nested dicts included; the rest is kept."""
    from specdraft.train.trainer import merge_config

    recipe = load_recipe(_write(tmp_path, BASE + "train: {strategy: deepspeed_stage_3}\n"),
                         ["train.deepspeed.zero_optimization.reduce_bucket_size=500000000",
                          "train.deepspeed.steps_per_print=10"])
    config = {"zero_optimization": {"stage": 3, "reduce_bucket_size": 200_000_000}, "steps_per_print": 1}
    assert merge_config(config, recipe.train.deepspeed) == {
        "zero_optimization": {"stage": 3, "reduce_bucket_size": 500_000_000}, "steps_per_print": 10}


def test_an_older_recipes_renamed_keys_load_under_their_names_now(tmp_path):
    """eval.num_draft_tokens is eval.depth (specdraft.config.RENAMED_KEYS): in the file and as an override."""
    assert load_recipe(_write(tmp_path, BASE + "eval: {num_draft_tokens: 3}\n")).eval.depth == 3
    assert load_recipe(_write(tmp_path, BASE), ["eval.num_draft_tokens=2"]).eval.depth == 2
    assert load_recipe(_write(tmp_path, BASE + "eval: {num_draft_tokens: 3}\n"), ["eval.depth=4"]).eval.depth == 4
