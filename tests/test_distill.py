"""specdraft.distill.run end to end on a tiny random target: rows, loss masks, counts, resumption, too-long prompts and
generation failures. CPU, offline."""
import json
import shutil

import pytest
from datasets import load_from_disk

import specdraft.distill.run as distill
from specdraft.distill.run import run_distill
from specdraft.recipes import load_recipe
from specdraft.data.format import ROW_FEATURES, counts_path, dataset_dir, read_counts, shards_dir
from specdraft.core.errors import SpecdraftError
from specdraft.testing.tiny import byte_tokenizer, save_tiny_target

RECORDS = [{"prompt": "hello"}, {"turns": ["first question", "second one"]},
           {"conversations": [{"from": "gpt", "value": "no question here"}]},
           {"messages": [{"role": "system", "content": "be nice"}, {"role": "user", "content": "hi"}]},
           {"instruction": "add", "input": "2 and 2"}]


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    return save_tiny_target(tmp_path_factory.mktemp("distill_target"))


def make_recipe(tmp_path, target_dir, records=RECORDS, overrides=(), out="out"):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(record) + "\n" for record in records))
    path = tmp_path / "recipe.yaml"
    path.write_text(f"target: {{path: {target_dir}}}\nmethod: {{name: eagle3}}\n"
                    f"data: {{prompts: [{prompts}], max_length: 256}}\n"
                    f"distill: {{output_dir: {tmp_path / out}, max_new_tokens: 6, batch_size: 2, shard_size: 2}}\n")
    return load_recipe(path, list(overrides))


@pytest.fixture
def recorded(monkeypatch):
    """Every answer generated, keyed by its decoded prompt text."""
    answers = {}
    original = distill.generate_answers
    tokenizer = byte_tokenizer()

    def recording(ctx, prompts):
        outputs = original(ctx, prompts)
        answers.update({tokenizer.decode(ids): text for ids, text in zip(prompts, outputs)})
        return outputs

    monkeypatch.setattr(distill, "generate_answers", recording)
    return answers


def masked_text(row, tokenizer):
    return tokenizer.decode([t for t, m in zip(row["input_ids"], row["loss_mask"]) if m])


def test_end_to_end_rows_masks_and_counts(tmp_path, target_dir, recorded):
    recipe = make_recipe(tmp_path, target_dir)
    counts = run_distill(recipe, device="cpu")
    out = tmp_path / "out"
    assert counts == read_counts(out) == {"input": 5, "ok": 4, "error": 0, "skipped": 1}
    dataset = load_from_disk(str(dataset_dir(out)))
    assert dataset.features == ROW_FEATURES and len(dataset) == 4
    tokenizer = byte_tokenizer()
    for row in dataset:
        text = tokenizer.decode(row["input_ids"])
        prompt, _, answer_and_end = text.rpartition("<|im_start|>assistant\n")
        assert len(row["input_ids"]) == len(row["loss_mask"]) <= 256
        if row["turns"] == 1:
            assert masked_text(row, tokenizer) == recorded[prompt + "<|im_start|>assistant\n"] + "<|im_end|>\n"
            assert answer_and_end == masked_text(row, tokenizer)
        assert (row["target"], row["target_revision"], row["max_new_tokens"]) == (str(target_dir), "", 6)
    assert [row["index"] for row in dataset] == [0, 1, 3, 4]
    errors = [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]
    assert errors == [{"source": recipe.data.prompts[0], "index": 2, "status": "skipped", "reason": "no user turn"}]
    assert (out / "recipe.yaml").is_file() and sorted(p.name for p in shards_dir(out).iterdir()) == [
        "shard-00000", "shard-00001", "shard-00002"]


def test_multi_turn_gets_two_assistant_spans(tmp_path, target_dir, recorded):
    run_distill(make_recipe(tmp_path, target_dir, records=[{"turns": ["what is up", "and then"]}]), device="cpu")
    row = load_from_disk(str(dataset_dir(tmp_path / "out")))[0]
    tokenizer = byte_tokenizer()
    mask = row["loss_mask"]
    starts = [i for i in range(len(mask)) if mask[i] and (i == 0 or not mask[i - 1])]
    assert row["turns"] == 2 and len(starts) == 2
    first_prompt = "<|im_start|>user\nwhat is up<|im_end|>\n<|im_start|>assistant\n"
    first, second = recorded[first_prompt], next(v for k, v in recorded.items() if k != first_prompt)
    second_prompt = first_prompt + first + "<|im_end|>\n<|im_start|>user\nand then<|im_end|>\n<|im_start|>assistant\n"
    assert recorded[second_prompt] == second
    assert masked_text(row, tokenizer) == f"{first}<|im_end|>\n{second}<|im_end|>\n"


def test_resume_regenerates_only_missing_shard(tmp_path, target_dir, monkeypatch):
    recipe = make_recipe(tmp_path, target_dir)
    run_distill(recipe, device="cpu")
    out = tmp_path / "out"
    first = load_from_disk(str(dataset_dir(out))).to_list()
    shutil.rmtree(shards_dir(out) / "shard-00000")
    shutil.rmtree(dataset_dir(out))
    (shards_dir(out) / ".tmp-shard-00000-dead").mkdir()  # what a killed run leaves behind
    batches = []
    original = distill.generate_answers
    monkeypatch.setattr(distill, "generate_answers",
                        lambda ctx, prompts: batches.append(prompts) or original(ctx, prompts))
    counts = run_distill(recipe, device="cpu")
    assert counts == {"input": 5, "ok": 4, "error": 0, "skipped": 1}
    assert [len(b) for b in batches] == [2, 1]  # shard 0 only: turn 0 of both conversations, turn 1 of one
    assert load_from_disk(str(dataset_dir(out))).to_list() == first
    assert not list(shards_dir(out).glob(".tmp-*"))
    assert json.loads((out / "errors.jsonl").read_text())["index"] == 2  # kept from the untouched shard 1


def test_sampled_resume_draws_the_same(tmp_path, target_dir):
    recipe = make_recipe(tmp_path, target_dir, overrides=["distill.temperature=0.9", "distill.top_p=0.95"])
    run_distill(recipe, device="cpu")
    out = tmp_path / "out"
    first = load_from_disk(str(dataset_dir(out))).to_list()
    shutil.rmtree(shards_dir(out) / "shard-00000")
    run_distill(recipe, device="cpu")
    again = load_from_disk(str(dataset_dir(out))).to_list()
    assert again == first and again[0]["temperature"] == pytest.approx(0.9)


def test_changed_settings_need_a_new_output_dir(tmp_path, target_dir):
    run_distill(make_recipe(tmp_path, target_dir, records=[{"prompt": "x"}]), device="cpu")
    changed = make_recipe(tmp_path, target_dir, records=[{"prompt": "x"}], overrides=["distill.temperature=0.5"])
    with pytest.raises(SpecdraftError, match="different distill.temperature; use a new distill.output_dir"):
        run_distill(changed, device="cpu")


def test_too_long_error_before_any_shard(tmp_path, target_dir):
    records = [{"prompt": "short"}, {"prompt": "short"}, {"prompt": "y" * 300}]
    recipe = make_recipe(tmp_path, target_dir, records=records)
    expected = r"conversation 2 of .*prompts.jsonl: prompt is 3\d\d tokens.*max_length=256"
    with pytest.raises(SpecdraftError, match=expected):
        run_distill(recipe, device="cpu")
    assert not list(shards_dir(tmp_path / "out").glob("shard-*"))


def test_too_long_skip_is_counted(tmp_path, target_dir):
    records = [{"prompt": "short"}, {"prompt": "y" * 300}]
    counts = run_distill(make_recipe(tmp_path, target_dir, records=records, overrides=["data.too_long=skip"]),
                         device="cpu")
    assert counts == {"input": 2, "ok": 1, "error": 0, "skipped": 1}
    error = json.loads((tmp_path / "out" / "errors.jsonl").read_text())
    assert error["index"] == 1 and "max_length=256" in error["reason"]


def test_generation_failure_is_recorded_per_prompt(tmp_path, target_dir, monkeypatch):
    original = distill.generate_answers

    def flaky(ctx, prompts):
        if any(byte_tokenizer().decode(ids).count("boom") for ids in prompts):
            raise RuntimeError("CUDA out of memory\ndetails")
        return original(ctx, prompts)

    monkeypatch.setattr(distill, "generate_answers", flaky)
    records = [{"prompt": "boom"}, {"prompt": "fine"}, {"prompt": "also fine"}]
    counts = run_distill(make_recipe(tmp_path, target_dir, records=records), device="cpu")
    assert counts == {"input": 3, "ok": 1, "error": 2, "skipped": 0}  # "boom" shares its batch with "fine"
    errors = [json.loads(line) for line in (tmp_path / "out" / "errors.jsonl").read_text().splitlines()]
    assert [e["index"] for e in errors] == [0, 1]
    assert errors[0]["reason"] == "generation failed: RuntimeError: CUDA out of memory"
    assert counts_path(tmp_path / "out").is_file()


def test_empty_prompt_set_is_an_error(tmp_path, target_dir):
    with pytest.raises(SpecdraftError, match="no prompts in"):
        run_distill(make_recipe(tmp_path, target_dir, records=[]), device="cpu")


def test_bad_distill_settings(tmp_path, target_dir):
    with pytest.raises(SpecdraftError, match="distill.top_p must be in"):
        run_distill(make_recipe(tmp_path, target_dir, overrides=["distill.top_p=0"]), device="cpu")
