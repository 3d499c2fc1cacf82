"""`specdraft build-small-vlm` (specdraft/vlm/) in its tiny mode: the saved directory loads as a plain LLaVA model + processor and
generates from an image prompt, the processor gives the rows the tool trained on, the drawn prompt sets are well
formed, and the accuracy report is written. The determined tasks (a grid, words, a bar chart's values): drawn the
same every time and as their listing says, scored item by item, held out by image, reported per kind."""
import dataclasses
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from specdraft import cli
from specdraft.core.errors import SpecdraftError
from specdraft.vlm import build as build_small_vlm
from specdraft.vlm import determined as vlm_determined
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


# ---- the determined tasks: answers the image decides token by token ----------------------------------------------
def _near(pixel, colour, tolerance=30) -> bool:
    return all(abs(int(p) - c) <= tolerance for p, c in zip(pixel, colour))


def test_determined_scenes_draw_the_same_image_every_time_and_their_listing_reads_back():
    scenes = vlm_scenes.distinct_scenes(30, seed=7, seen=set())
    assert [scene.kind for scene in scenes[:6]] == list(vlm_scenes.DETERMINED_KINDS) * 2  # in turn
    assert scenes == vlm_scenes.distinct_scenes(30, seed=7, seen=set())
    for scene, other in zip(scenes, scenes[3:] + scenes[:3]):  # `other`: another scene of the same kind
        assert vlm_scenes.draw(scene, 64).tobytes() == vlm_scenes.draw(scene, 64).tobytes()
        truth = vlm_scenes.facts(scene)
        text = vlm_determined.listing(scene)
        assert vlm_determined.score_listing(truth, text) == {"hits": vlm_determined.ITEMS[scene.kind],
                                                              "items": vlm_determined.ITEMS[scene.kind],
                                                              "exact": True}
        assert not vlm_determined.score_listing(truth, vlm_determined.listing(other))["exact"]
    moved = dataclasses.replace(scenes[0], seed=scenes[0].seed + 1)  # the same facts, other jitter
    assert moved == scenes[0] and vlm_scenes.draw(moved, 64).tobytes() != vlm_scenes.draw(scenes[0], 64).tobytes()


def test_a_grid_draws_each_cell_s_shape_in_its_colour_and_leaves_empty_cells_blank():
    size = 128
    scenes = [s for s in vlm_scenes.distinct_scenes(30, seed=8, seen=set()) if s.kind == "grid"]
    for scene in scenes:
        image = vlm_scenes.draw(scene, size)
        cell = size / vlm_scenes.GRID
        for index, (colour, _) in enumerate(scene.cells):
            centre = image.getpixel((int(cell * (index % vlm_scenes.GRID + 0.5)),
                                     int(cell * (index // vlm_scenes.GRID + 0.5))))
            assert _near(centre, vlm_scenes.COLOURS[colour] if colour else vlm_scenes.BACKGROUND, 32), (index, colour)


def test_a_values_chart_draws_each_bar_to_its_value():
    size, scene = 100, next(s for s in vlm_scenes.distinct_scenes(9, seed=9, seen=set()) if s.kind == "values")
    image = vlm_scenes.draw(scene, size)
    margin, base, unit = 0.05 * size, 0.95 * size, 0.09 * size  # the renderer's layout
    slot = (size - 2 * margin) / len(scene.bars)
    for number, (colour, value) in enumerate(scene.bars):
        x = int(margin + slot * (number + 0.5))
        rows = [y for y in range(size) if _near(image.getpixel((x, y)), vlm_scenes.COLOURS[colour], 22)]
        assert round((base - min(rows)) / unit) == value, (number, colour, value)


def test_a_word_changed_changes_the_image_in_its_own_place_alone():
    scene = next(s for s in vlm_scenes.distinct_scenes(9, seed=10, seen=set()) if s.kind == "words")
    size, index = 96, 3  # the second line's right word
    other = next(word for word in vlm_scenes.WORD_LIST if word != scene.words[index])
    changed = dataclasses.replace(scene, words=scene.words[:index] + (other,) + scene.words[index + 1:])
    before, after = (np.asarray(vlm_scenes.draw(s, size)).astype(int) for s in (scene, changed))
    ys, xs = np.nonzero(np.abs(before - after).sum(-1))
    line, column = divmod(index, vlm_scenes.WORDS_PER_LINE)
    row, half = size / vlm_scenes.WORD_LINES, size / vlm_scenes.WORDS_PER_LINE
    assert len(xs) and xs.min() >= half * column - 1 and xs.max() <= half * (column + 1) + 1
    assert ys.min() >= row * (line - 0.2) and ys.max() <= row * (line + 1.2)


def test_listings_are_scored_item_by_item():
    scene = next(s for s in vlm_scenes.distinct_scenes(3, seed=11, seen=set()) if s.kind == "grid")
    truth, lines = vlm_scenes.facts(scene), vlm_determined.listing(scene).splitlines()
    first = lines[0].split(": ")[1].rstrip(".").split(", ")
    wrong = "empty" if first[0] != "empty" else "red circle"
    one_off = "\n".join([f"Row 1: {', '.join([wrong] + first[1:])}.", *lines[1:]])
    assert vlm_determined.score_listing(truth, one_off)["hits"] == 15
    assert vlm_determined.score_listing(truth, "\n".join(lines[1:]))["hits"] == 12  # row 1 not stated
    assert vlm_determined.score_listing(truth, "\n".join([*lines, one_off]))["exact"]  # a line's first statement
    assert vlm_determined.score_listing(truth, "I see shapes.") == {"hits": 0, "items": 16, "exact": False}
    values = {"kind": "values", "bars": [["red", 7], ["blue", 3]]}
    assert vlm_determined.read_listing("values", "Bar 1: red, 7.\nBar 2: blue, 12.")[:2] == ["red, 7", None]
    assert vlm_determined.score_listing(values, "Bar 1: red, 7.\nBar 2: blue, 12.")["hits"] == 1


def test_held_out_determined_images_repeat_no_earlier_one():
    def tiny_space(rng, number):
        return vlm_scenes.Scene("words", words=(rng.choice(("cat", "dog", "sun")),))

    seen = {vlm_scenes.Scene("words", words=("cat",))}
    drawn = vlm_scenes.distinct_scenes(2, seed=0, seen=seen, draw=tiny_space)
    assert sorted(scene.words for scene in drawn) == [("dog",), ("sun",)]


def test_determined_scenes_pretrain_the_tower_on_every_item():
    names = [name for name, _ in vlm_scenes.AUX_SLOTS]
    for scene in vlm_scenes.distinct_scenes(3, seed=12, seen=set()):
        labels = dict(zip(names, vlm_scenes.aux_labels(scene)))
        assert labels["kind"] == vlm_scenes.ALL_KINDS.index(scene.kind)
        prefix = {"grid": "grid", "words": "words", "values": "values"}[scene.kind]
        own = [name for name in names if name.startswith(prefix)]
        assert own and all(labels[name] != vlm_scenes.IGNORE for name in own)
        assert all(labels[name] == vlm_scenes.IGNORE for name in names if name not in own and name != "kind")
    grid = next(s for s in vlm_scenes.distinct_scenes(3, seed=12, seen=set()) if s.kind == "grid")
    labels = dict(zip(names, vlm_scenes.aux_labels(grid)))
    assert [labels[f"grid{i}_colour"] == 0 for i in range(16)] == [colour == "" for colour, _ in grid.cells]


def test_the_build_writes_held_out_determined_sets_and_scores_its_answers_per_kind(built):
    folder = built / "prompts" / vlm_prompts.DETERMINED
    trained = set(map(json.dumps, (vlm_scenes.facts(scene) for scene in vlm_prompts.determined_pool(
        round(build_small_vlm.TINY.pool * build_small_vlm.TINY.determined_share), 0))))
    splits = {}
    for split, count in (("distill", 3), ("test", 3)):
        records = vlm_prompts.read_prompt_set(folder / f"{split}.jsonl")
        assert len(records) == count
        for record in records:
            kind = record["facts"]["kind"]
            human, gpt = record["conversations"]
            assert human["value"].split("\n", 1)[1] in vlm_determined.QUESTIONS[kind]
            assert vlm_determined.score_listing(record["facts"], gpt["value"])["exact"]
            assert (folder / record["image"]).is_file()
        splits[split] = set(json.dumps(record["facts"]) for record in records)
    assert not splits["distill"] & trained and not splits["test"] & (trained | splits["distill"])
    determined = json.loads((built / "accuracy.json").read_text())["determined"]
    assert determined["prompt_set"] == "prompts/determined/test.jsonl" and determined["images"] == 3
    assert sum(row["n"] for row in determined["kinds"].values()) == 3
    for row in determined["kinds"].values():
        assert 0 <= row["item_accuracy"] <= 1 and 0 <= row["exact"] <= 1
    assert "| determined task |" in vlm_prompts.determined_table({"determined": determined})


def test_the_pool_asks_a_determined_scene_its_kind_s_questions_and_answers_its_listing(built):
    from transformers import AutoProcessor

    tokenizer, settings = AutoProcessor.from_pretrained(built).tokenizer, build_small_vlm.TINY
    scenes = vlm_scenes.random_scenes(3, seed=13) + vlm_scenes.distinct_scenes(3, seed=13, seen=set())
    pixels = build_small_vlm.draw_pixels(scenes, settings.image_size, 1)
    pool = build_small_vlm.make_pool(scenes, pixels, tokenizer, settings, "cpu")
    assert pool.prompts[False]["grid"] == [build_small_vlm.prompt_ids(tokenizer, question, settings)
                                           for question in vlm_determined.QUESTIONS["grid"]]
    for index, scene in enumerate(scenes[3:], start=3):
        assert pool.answers[True][index] == pool.answers[False][index]
        assert tokenizer.decode(pool.answers[False][index][:-1]) == vlm_determined.listing(scene)
    with pytest.raises(SpecdraftError, match="determined_share=1.5"):
        build_small_vlm.parse_settings(build_small_vlm.Settings(), ["determined_share=1.5"])
