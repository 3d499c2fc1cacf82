"""`specdraft build-small-vlm` (specdraft/vlm/) in its tiny mode: the saved directory loads as a plain LLaVA model + processor and
generates from an image prompt, the processor gives the rows the tool trained on, the drawn prompt sets are well
formed, and the accuracy report is written."""
import json
import random
from pathlib import Path

import pytest
import torch

from specdraft import cli
from specdraft.core.errors import SpecdraftError
from specdraft.vlm import build as build_small_vlm
from specdraft.vlm import long as vlm_long
from specdraft.vlm import prompts as vlm_prompts
from specdraft.vlm import scenes as vlm_scenes


@pytest.fixture(scope="module")
def built(tiny_target_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("small_vlm") / "vlm"
    assert cli.main(["build-small-vlm", "--out", str(out), "--tiny", "--target", str(tiny_target_dir),
                     "--device", "cpu"]) == 0
    return out


def test_loads_as_llava_and_generates_from_an_image(built):
    from PIL import Image
    from safetensors import safe_open
    from transformers import AutoModelForImageTextToText, AutoProcessor, LlavaForConditionalGeneration

    model = AutoModelForImageTextToText.from_pretrained(built)
    processor = AutoProcessor.from_pretrained(built)
    assert isinstance(model, LlavaForConditionalGeneration)
    assert model.config.vision_config.model_type == "siglip_vision_model"
    assert type(processor).__name__ == "LlavaProcessor"
    with safe_open(str(built / "model.safetensors"), "pt") as weights:
        assert not [key for key in weights.keys() if "lora" in key]  # the adapters are merged
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe this image."}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    image = Image.open(built / "prompts" / "images" / "test-00000.png")
    inputs = processor(images=[image], text=[text], return_tensors="pt")
    assert (inputs["input_ids"] == model.config.image_token_id).sum() == model.config.image_seq_length
    output = model.generate(**inputs, max_new_tokens=5, do_sample=False)
    assert output.shape[1] > inputs["input_ids"].shape[1]


def test_processor_gives_the_rows_the_tool_trains_on(built):
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(built)
    settings = build_small_vlm.TINY
    scene = vlm_scenes.random_scenes(1, seed=5)[0]
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": vlm_scenes.PROMPTS[1]}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    inputs = processor(images=[vlm_scenes.draw(scene, settings.image_size)], text=[text], return_tensors="pt")
    expected_ids = build_small_vlm.prompt_ids(processor.tokenizer, vlm_scenes.PROMPTS[1], settings)
    assert inputs["input_ids"][0].tolist() == expected_ids
    pixels = build_small_vlm.normalize(torch.from_numpy(vlm_scenes.draw_array(scene, settings.image_size))[None])
    torch.testing.assert_close(inputs["pixel_values"], pixels, atol=1e-5, rtol=0)


def test_prompt_sets_are_well_formed(built):
    from specdraft.data.sources import load_conversations

    folder = built / "prompts"
    seen = set()
    for split, count in (("distill", 4), ("test", 6)):
        path = folder / f"{split}.jsonl"
        records = [json.loads(line) for line in path.read_text().splitlines()]
        assert len(records) == count
        for record in records:
            assert (path.parent / record["image"]).is_file()
            human, gpt = record["conversations"]
            assert human["from"] == "human" and human["value"].startswith("<image>\n")
            assert all(vlm_scenes.score(record["facts"], vlm_scenes.read_description(gpt["value"])).values())
            seen.add(record["image"])
        conversations = load_conversations([str(path)])
        assert [c.skip_reason for c in conversations] == [None] * count
    assert len(seen) == 10
    assert (folder / "README.md").is_file()


def test_accuracy_report(built):
    report = json.loads((built / "accuracy.json").read_text())
    assert report["images"] == 6 and report["prompt_set"] == "prompts/test.jsonl"
    assert {"count", "colours", "shapes"} <= set(report["attributes"])
    for row in report["attributes"].values():
        assert 0 <= row["accuracy"] <= 1 and 0 <= row["chance"] <= 1 and row["n"] > 0
    record = json.loads((built / "build.json").read_text())
    assert set(record["stages"]) == {"tower", "align", "lora"}


def test_descriptions_read_back_and_chance_is_low():
    scenes = vlm_scenes.random_scenes(300, seed=3)
    for scene in scenes:
        stated = vlm_scenes.read_description(vlm_scenes.describe(scene))
        assert all(vlm_scenes.score(vlm_scenes.facts(scene), stated).values())
    records = [vlm_prompts.prompt_record("test", i, s) for i, s in enumerate(scenes)]
    answers = [random.Random(0).choice(records)["conversations"][1]["value"] for _ in records]
    report = vlm_prompts.accuracy(records, answers)
    assert report["count"]["chance"] < 0.4 and report["colours"]["chance"] < 0.2
    assert report["count"]["accuracy"] < 0.6


def test_settings_override():
    settings = build_small_vlm.parse_settings(build_small_vlm.Settings(), ["lora_steps=5", "tiny_lm=true"])
    assert settings.lora_steps == 5 and settings.tiny_lm
    with pytest.raises(SpecdraftError, match="unknown setting"):
        build_small_vlm.parse_settings(build_small_vlm.Settings(), ["nope=1"])



def test_long_descriptions_open_with_the_short_one_state_every_fact_and_mostly_depend_on_the_image():
    scenes = vlm_scenes.random_scenes(300, seed=4)
    for scene in scenes:
        text = vlm_long.describe_long(scene)
        assert text.startswith(vlm_scenes.describe(scene) + "\n\n")
        assert all(vlm_long.score_long(vlm_scenes.facts(scene), text).values()), text
    assert vlm_long.blind_share(scenes) > 0.4  # of the words a writer blind to the image gets wrong
    words = [len(vlm_long.describe_long(scene).split()) for scene in scenes]
    assert 60 < sum(words) / len(words) < 250 and max(words) < 320  # about 200 SmolLM2 tokens on average
    other = vlm_scenes.random_scenes(1, seed=5)[0]
    wrong = vlm_long.describe_long(other)
    assert not all(vlm_long.score_long(vlm_scenes.facts(scenes[0]), wrong).values())


def test_the_instruction_is_the_one_the_recipes_append():
    from specdraft.recipes import load_recipe

    root = Path(__file__).resolve().parents[1] / "recipes"
    for name in ("vispec_smallvlm.yaml", "smoke/vispec_smallvlm.yaml", "vispec_llava16.yaml"):
        assert load_recipe(root / name, []).distill.answer_instruction == vlm_long.INSTRUCTION


def test_long_rows_are_what_distillation_sends(built):
    """The builder's long-answer prompt is distillation's prompt with the instruction appended (with_instruction),
    token for token; a long batch holds long answers."""
    from PIL import Image
    from transformers import AutoProcessor

    from specdraft.distill.image_prompts import with_instruction
    from specdraft.data.sources import load_conversations
    from specdraft.targets.chat import VisionChat

    processor = AutoProcessor.from_pretrained(built)
    conversation = load_conversations([str(built / "prompts" / "distill.jsonl")])[0]
    prompt = vlm_scenes.PROMPTS[0]
    assert conversation.messages[0]["content"] == f"<image>\n{prompt}"
    messages = with_instruction(conversation, vlm_long.INSTRUCTION).messages[:1]  # the user turn
    image = Image.open(conversation.images[0]).convert("RGB")
    distilled = VisionChat(processor).ids(messages, [image], add_generation_prompt=True)
    tokenizer, settings = processor.tokenizer, build_small_vlm.TINY
    assert build_small_vlm.prompt_ids(tokenizer, vlm_long.long_prompt(prompt), settings) == distilled
    scenes = vlm_scenes.random_scenes(8, seed=6)
    pixels = build_small_vlm.draw_pixels(scenes, settings.image_size, 1)
    pool = build_small_vlm.make_pool(scenes, pixels, tokenizer, settings, "cpu")
    batch = build_small_vlm.caption_batch(pool, random.Random(0), 3, tokenizer.pad_token_id, "cpu", long=True)
    answer = tokenizer.decode(batch["labels"][0][batch["labels"][0] >= 0], skip_special_tokens=True)
    assert "\n\n" in answer and vlm_long.INSTRUCTION in tokenizer.decode(batch["input_ids"][0])
    assert build_small_vlm.long_schedule(6, 0.5) == [False, True] * 3
    assert build_small_vlm.long_schedule(4, 0.0) == [False] * 4


def test_accuracy_reports_long_answers_beside_plain_ones(built):
    long = json.loads((built / "accuracy.json").read_text())["long"]
    assert long["instruction"] == vlm_long.INSTRUCTION and long["images"] == 2
    assert long["lengths"]["with"]["answers"] == long["lengths"]["without"]["answers"] == 2
    assert set(long["attributes"]) <= {"count", "colours", "shapes", "objects", "sizes", "word", "word_colour",
                                       "word_row", "bar_count", "bar_colours", "tallest", "bar_values"}
    assert "| with instruction | 2 |" in vlm_prompts.long_table({"long": long})
