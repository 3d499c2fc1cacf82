"""`specdraft distill-data` on image prompt sets (CPU, a tiny random LLaVA built in the test): the documented JSONL
form and LLaVA's JSON form, images stored once by content hash with the shards, a missing or unreadable image a
counted error naming its file while every other prompt is kept, the answer instruction, and resume."""
import json
import shutil

import pytest
import torch
from datasets import load_from_disk

from specdraft.distill.run import run_distill
from specdraft.core.errors import SpecdraftError
from specdraft.data.format import IMAGE_ROW_FEATURES, dataset_dir, shards_dir
from specdraft.data.images import load_image, resolve_image
from specdraft.recipes import load_recipe
from specdraft.targets.vision import image_model_inputs
from specdraft.testing.tiny import save_tiny_target
from tests.tiny_vlm import drawn_image, save_tiny_vlm, tiny_vlm

LONG = "Please answer with at least 1000 words."


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory):
    return save_tiny_vlm(tmp_path_factory.mktemp("vlm"), "llava")


def image_prompt_sets(folder):
    """A JSONL set (one prompt with a missing image, one with a corrupt one) and a LLaVA JSON set."""
    (folder / "imgs").mkdir(parents=True)
    for number in range(3):
        drawn_image(number).save(folder / "imgs" / f"{number}.png")
    (folder / "imgs" / "broken.png").write_bytes(b"not a png at all")
    jsonl = [{"image": "imgs/0.png", "prompt": "<image>\nDescribe it."},
             {"image": "imgs/missing.png", "prompt": "<image>\nAnd this?"},
             {"images": ["imgs/1.png"], "messages": [{"role": "user", "content": "What colours?"}]},
             {"image": "imgs/broken.png", "prompt": "<image>\nWhat is it?"},
             {"prompt": "no image, just text"}]
    llava = [{"id": "a", "image": "imgs/2.png", "conversations": [{"from": "human", "value": "<image>\nCount them."},
                                                                   {"from": "gpt", "value": "a reference"}]},
             {"id": "b", "image": "imgs/0.png", "conversations": [{"from": "human", "value": "Again?\n<image>"}]}]
    (folder / "set.jsonl").write_text("".join(json.dumps(r) + "\n" for r in jsonl))
    (folder / "llava.json").write_text(json.dumps(llava))
    return [str(folder / "set.jsonl"), str(folder / "llava.json")]


def make_recipe(tmp_path, target, prompts, *overrides):
    path = tmp_path / "recipe.yaml"
    path.write_text(f"target: {{path: {target}, dtype: float32}}\nmethod: {{name: eagle3}}\n"
                    f"data: {{prompts: {json.dumps(prompts)}, max_length: 256}}\n"
                    f"distill: {{output_dir: {tmp_path / 'out'}, max_new_tokens: 6, batch_size: 2, shard_size: 3}}\n")
    return load_recipe(path, list(overrides))


def test_image_prompt_sets_distill_with_images_stored_and_broken_ones_counted(tmp_path, vlm_dir):
    prompts = image_prompt_sets(tmp_path / "prompts")
    recipe = make_recipe(tmp_path, vlm_dir, prompts, f"distill.answer_instruction={LONG}")
    counts = run_distill(recipe, device="cpu")
    out = tmp_path / "out"
    assert counts == {"input": 7, "ok": 5, "error": 2, "skipped": 0}
    errors = {e["index"]: e["reason"] for e in map(json.loads, (out / "errors.jsonl").read_text().splitlines())}
    assert errors[1] == f"image not found: {tmp_path / 'prompts' / 'imgs' / 'missing.png'}"
    assert errors[3].startswith(f"unreadable image {tmp_path / 'prompts' / 'imgs' / 'broken.png'}: ")
    dataset = load_from_disk(str(dataset_dir(out)))
    assert dataset.features == IMAGE_ROW_FEATURES
    assert [len(row["images"]) for row in dataset] == [1, 1, 0, 1, 1]
    stored = sorted(p.name for p in (out / "images").iterdir())
    assert len(stored) == 3 and dataset[0]["images"] == dataset[4]["images"]  # imgs/0.png twice, stored once
    model, processor = tiny_vlm("llava")
    image_token, tokenizer = model.config.image_token_id, processor.tokenizer
    for row in dataset:
        assert row["input_ids"].count(image_token) == 16 * len(row["images"])  # 32 x 32 pixels in 8 x 8 patches
        assert LONG in tokenizer.decode(row["input_ids"])
    row = dataset[0]  # its answer is the target's own greedy answer over the image, batched with another prompt
    prompt = row["input_ids"][:row["loss_mask"].index(1)]
    image = load_image(resolve_image(row["images"][0], [out]))
    inputs = image_model_inputs(processor, model, torch.tensor([prompt]), [[image]])
    greedy = model.generate(**inputs, do_sample=False, max_new_tokens=6, pad_token_id=tokenizer.pad_token_id,
                            eos_token_id=tokenizer.eos_token_id)[0, len(prompt):]
    answer = [t for t, m in zip(row["input_ids"], row["loss_mask"]) if m]  # text re-templated: compare as text
    assert tokenizer.decode(answer).startswith(tokenizer.decode(greedy, skip_special_tokens=True))


def test_a_resumed_image_run_regenerates_only_the_missing_shard_and_moves_as_one_folder(tmp_path, vlm_dir):
    recipe = make_recipe(tmp_path, vlm_dir, image_prompt_sets(tmp_path / "prompts"))
    run_distill(recipe, device="cpu")
    out = tmp_path / "out"
    first = load_from_disk(str(dataset_dir(out))).to_list()
    shutil.rmtree(shards_dir(out) / "shard-00001")
    written = {shard.name: shard.stat().st_mtime for shard in shards_dir(out).iterdir()}
    assert run_distill(recipe, device="cpu") == {"input": 7, "ok": 5, "error": 2, "skipped": 0}
    assert load_from_disk(str(dataset_dir(out))).to_list() == first
    again = {shard.name: shard.stat().st_mtime for shard in shards_dir(out).iterdir()}
    assert {name for name in again if again[name] != written.get(name)} == {"shard-00001"}
    moved = tmp_path / "moved"
    shutil.move(str(out), moved)
    for row in load_from_disk(str(dataset_dir(moved))):
        assert all(resolve_image(name, [moved]).is_file() for name in row["images"])


def test_image_prompts_need_a_target_that_reads_images(tmp_path):
    text_target = save_tiny_target(tmp_path / "text")
    recipe = make_recipe(tmp_path, text_target, image_prompt_sets(tmp_path / "prompts"))
    with pytest.raises(SpecdraftError, match="conversation 0 of .*set.jsonl has images, and the target reads none"):
        run_distill(recipe, device="cpu")


def test_a_vision_target_computes_its_features_online(tmp_path, vlm_dir):
    recipe = make_recipe(tmp_path, vlm_dir, image_prompt_sets(tmp_path / "prompts"), "data.features=offline")
    with pytest.raises(SpecdraftError, match="is a vision-language model: its features are computed online"):
        run_distill(recipe, device="cpu")
