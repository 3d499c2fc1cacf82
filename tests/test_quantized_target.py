"""The weight-only quantized target (target.quantization=int8|int4) in every stage, on a tiny target, CPU: distill-data
answers with it (Hugging Face generate and the static engine, over its quantized layers), training reads its
features, export and eval verify with it (lossless against its own greedy answers); offline training's LM head is
its own; runtime.quantization decodes a draft for another target's weights; a setting no stage can run is a
one-line error naming its key."""
import json

import pytest
import torch
from datasets import load_from_disk

from specdraft import cli
from specdraft.config import TargetConfig
from specdraft.core.errors import SpecdraftError
from specdraft.data.format import dataset_dir
from specdraft.layers.quantized import QuantizedLinear
from specdraft.recipes import load_recipe
from specdraft.targets import load_target
from specdraft.targets.heads import load_target_heads
from specdraft.testing.tiny import byte_tokenizer
from tests.test_train_export_eval import make_recipe

pytestmark = pytest.mark.reference_kernels

PROMPTS = ["hello", "z", "add 2 and 2", "what is a cat?"]


def _answers(out) -> dict:
    """{prompt index: answer text} of a distilled dataset (single-turn rows; the template's end of turn cut)."""
    tokenizer = byte_tokenizer()
    rows = load_from_disk(str(dataset_dir(out))).to_list()
    return {row["index"]: tokenizer.decode([t for t, m in zip(row["input_ids"], row["loss_mask"]) if m],
                                           skip_special_tokens=True).removesuffix("\n") for row in rows}


def _greedy(target, text: str, max_new_tokens: int) -> str:
    """The target's greedy answer text to one user turn, as distill-data decodes it."""
    tokenizer = target.tokenizer
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                           return_tensors="pt", return_dict=True)["input_ids"]
    out = target.model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=max_new_tokens,
                                do_sample=False, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    return tokenizer.decode(out[0, prompt.shape[1]:].tolist(), skip_special_tokens=True)


def _recipe(tmp_path, tiny_target_dir):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    path = make_recipe(tmp_path, tiny_target_dir, tmp_path / "data", max_steps=4, val_every_steps=4)
    return path, [f"data.prompts=[{prompts}]", "data.max_length=256", "data.val_fraction=0.25",
                  "distill.max_new_tokens=10", "distill.batch_size=2", "distill.shard_size=4", "eval.max_prompts=2",
                  "eval.max_new_tokens=12", "target.quantization=int4"]


@pytest.mark.slow  # four stages, about a minute of CPU
def test_int4_target_distill_train_export_eval(tmp_path, tiny_target_dir):
    recipe, overrides = _recipe(tmp_path, tiny_target_dir)
    assert cli.main(["distill-data", str(recipe), *overrides]) == 0
    quantized = load_target(TargetConfig(path=str(tiny_target_dir), quantization="int4"))
    assert isinstance(quantized.model.model.layers[0].mlp.down_proj, QuantizedLinear)
    full = load_target(TargetConfig(path=str(tiny_target_dir)))
    answers = _answers(tmp_path / "data")
    expected = {i: _greedy(quantized, text, 10) for i, text in enumerate(PROMPTS)}
    assert answers == expected
    assert any(expected[i] != _greedy(full, text, 10) for i, text in enumerate(PROMPTS))  # it is another target
    assert cli.main(["distill-data", str(recipe), *overrides[:-1], "target.quantization=int4", "distill.engine=static",
                     f"distill.output_dir={tmp_path / 'static'}"]) == 0
    assert _answers(tmp_path / "static") == answers  # the compact target's quantized matmuls: the same answers

    assert cli.main(["train", str(recipe), *overrides]) == 0
    assert cli.main(["export", str(tmp_path / "run"), "--format", "hf", "--out", str(tmp_path / "hf")]) == 0
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["specdraft"]["target_config"][
        "quantization"] == "int4"
    for setting in ("int4", "none"):  # its own target; then the full-precision one, by runtime.quantization
        out = tmp_path / f"eval-{setting}"
        assert cli.main(["eval", str(tmp_path / "hf"), "--out", str(out), "eval.max_prompts=2",
                         "eval.max_new_tokens=12", f"runtime.quantization={setting}"]) == 0
        report = json.loads((out / "eval.json").read_text())
        assert report["lossless"] is True and report["settings"]["quantization"] == setting


def test_offline_heads_are_the_quantized_targets(tiny_target_dir):
    cfg = TargetConfig(path=str(tiny_target_dir), quantization="int8")
    heads = load_target_heads(cfg, embeddings=True)
    model = load_target(cfg).model
    assert torch.equal(heads.lm_head, model.get_output_embeddings().weight)
    assert torch.equal(heads.embed_tokens, model.get_input_embeddings().weight)  # the embedding stays as it is
    assert not torch.equal(heads.lm_head, load_target_heads(TargetConfig(path=str(tiny_target_dir)), False).lm_head)


def test_settings_a_stage_cannot_run_are_one_line_errors(tmp_path, tiny_target_dir, capsys):
    recipe, _ = _recipe(tmp_path, tiny_target_dir)
    with pytest.raises(SpecdraftError, match="unknown runtime.quantization '4bit'; valid: none, int8, int4"):
        load_recipe(recipe, ["runtime.quantization=4bit"])
    with pytest.raises(SystemExit):
        cli.main(["generate", str(tmp_path), "--prompt", "hi", "--quantization", "4bit"])
    assert "invalid choice: '4bit'" in capsys.readouterr().err
