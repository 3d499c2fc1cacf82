"""Held-out drawn-image prompt sets for a VLM built by `specdraft build-small-vlm`, and the accuracy of its
descriptions of them.

A prompt set is a folder:

    prompts/
      images/<split>-00000.png ...          the drawn images (RGB PNG, image_size x image_size)
      <split>.jsonl                         one prompt per line (below)
      README.md                             this form, in short

Each line is LLaVA's conversation form, the image a file path relative to the JSONL:

    {"id": "test-00000", "image": "images/test-00000.png",
     "conversations": [{"from": "human", "value": "<image>\\nDescribe this image."},
                       {"from": "gpt", "value": "The image shows two shapes on a white background: ..."}],
     "facts": {"kind": "shapes", "count": 2, "colours": [...], "shapes": [...], "objects": [...]}}

The human turn places the image with the `<image>` placeholder (LLaVA's convention; the model's chat template and
processor expand it); the gpt turn is the scene's true description (a reference: distillation regenerates
answers with the target); `facts` are what specdraft/vlm/scenes.py scores a description on. Splits: `distill`
(prompts to regenerate answers on, for draft training) and `test` (benches and this accuracy check), drawn from
seeds apart from each other and from the model's training scenes.

prompts/determined/ is a prompt set of the same form for the kinds whose answers the image determines token by
token (scenes.DETERMINED_KINDS; specdraft/vlm/determined.py): each record's question is its kind's, its gpt turn
the scene's listing, its `facts` the items. Held out by image: no scene of its `distill` split is one the VLM
trained on, and no scene of its `test` split one of either (each redrawn until it is not).
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import torch

from specdraft.vlm import determined as vlm_determined
from specdraft.vlm import long as vlm_long
from specdraft.vlm import scenes as vlm_scenes

SPLIT_SEEDS = {"distill": 1, "test": 2}
"""Offsets added to the build's seed (the training pool uses the seed itself)."""
DETERMINED_SEEDS = {"pool": 10, "distill": 11, "test": 12}
"""The same for the determined scenes: the training pool's, then each split's."""
DETERMINED = "determined"
"""The determined prompt set's folder under prompts/."""
README = """# Drawn-image prompt sets

Held-out images drawn by specdraft/vlm/scenes.py, never seen in training the VLM beside them. One JSON object a line:

    {"id": "test-00000", "image": "images/test-00000.png",
     "conversations": [{"from": "human", "value": "<image>\\nDescribe this image."},
                       {"from": "gpt", "value": "<the scene's true description>"}],
     "facts": {"kind": "shapes" | "word" | "chart", ...}}

`image` is relative to the JSONL file. The human turn places the image with `<image>` (LLaVA's form); the gpt
turn is a reference (distillation regenerates answers); `facts` are the scored attributes.
- distill.jsonl: prompts for regenerating answers with the VLM (draft training data)
- test.jsonl: prompts for benches and the accuracy check (accuracy.json beside the model)
- determined/: the same for the kinds whose answers the image determines item by item (its README.md)
"""


def prompt_record(split: str, number: int, scene: vlm_scenes.Scene) -> dict:
    name = f"{split}-{number:05d}"
    if scene.kind in vlm_scenes.DETERMINED_KINDS:
        prompt, answer = vlm_determined.question(scene.kind, number), vlm_determined.listing(scene)
    else:
        prompt, answer = vlm_scenes.PROMPTS[number % len(vlm_scenes.PROMPTS)], vlm_scenes.describe(scene)
    return {"id": name, "image": f"images/{name}.png",
            "conversations": [{"from": "human", "value": f"<image>\n{prompt}"}, {"from": "gpt", "value": answer}],
            "facts": vlm_scenes.facts(scene)}


def write_split(folder: Path, split: str, scenes: List[vlm_scenes.Scene], image_size: int) -> Path:
    """One split's images and JSONL under `folder` -> the JSONL's path."""
    (folder / "images").mkdir(parents=True, exist_ok=True)
    records = []
    for number, scene in enumerate(scenes):
        record = prompt_record(split, number, scene)
        vlm_scenes.draw(scene, image_size).save(folder / record["image"])
        records.append(record)
    path = folder / f"{split}.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def write_prompt_sets(folder: Path, image_size: int, seed: int, counts: Dict[str, int]) -> Dict[str, Path]:
    """Draws and writes each split's images and JSONL under `folder`; split -> JSONL path."""
    paths = {split: write_split(folder, split, vlm_scenes.random_scenes(count, seed + SPLIT_SEEDS[split]), image_size)
             for split, count in counts.items()}
    (folder / "README.md").write_text(README)
    return paths


def determined_pool(count: int, seed: int) -> List[vlm_scenes.Scene]:
    """The determined scenes the VLM trains on (distinct)."""
    return vlm_scenes.distinct_scenes(count, seed + DETERMINED_SEEDS["pool"], set())


def write_determined_sets(folder: Path, image_size: int, seed: int, counts: Dict[str, int],
                          trained: List[vlm_scenes.Scene]) -> Dict[str, Path]:
    """The determined prompt set under `folder` (module docstring): each split's scenes unlike the `trained` ones
    and every earlier split's; split -> JSONL path."""
    seen, paths = set(trained), {}
    for split, count in counts.items():
        scenes = vlm_scenes.distinct_scenes(count, seed + DETERMINED_SEEDS[split], seen)
        seen.update(scenes)
        paths[split] = write_split(folder, split, scenes, image_size)
    (folder / "README.md").write_text(DETERMINED_README)
    return paths


DETERMINED_README = """# Drawn-image prompt sets whose answers the image determines

The held-out images of specdraft/vlm/determined.py's kinds (a grid of shapes listed cell by cell, words
transcribed, a bar chart's values read out), in ../README.md's form: the human turn a question of its kind, the gpt
turn the scene's listing, `facts` its items. No image of distill.jsonl is one the VLM trained on, and none of
test.jsonl one of either. `python -m tools.bench.vispec VLM --tasks determined` trains and benches on these.
"""


def read_prompt_set(path: Path) -> List[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _user_turn(record: dict) -> str:
    return next(turn["value"] for turn in record["conversations"] if turn["from"] == "human")


def load_vlm(model_dir: Path, device: str):
    """(model, processor) of a saved VLM, loaded as any user loads one (the processor padding on the left)."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(model_dir)
    processor.tokenizer.padding_side = "left"
    dtype = torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    return AutoModelForImageTextToText.from_pretrained(model_dir, dtype=dtype).to(device).eval(), processor


def answer_lengths(generated: torch.Tensor, eos_id: int) -> List[int]:
    """generated [B, N] (what follows each prompt) -> each answer's tokens before its end of turn (N if none)."""
    ends = generated == eos_id
    return torch.where(ends.any(1), ends.int().argmax(1), generated.shape[1]).tolist()


def describe_images(vlm, records: List[dict], image_root: Path, device: str, max_new_tokens: int, batch: int,
                    instruction: Optional[str] = None) -> Tuple[List[str], List[int]]:
    """A loaded VLM's (load_vlm) greedy answers to each record's prompt over its image, `instruction` appended to
    the prompt on a line of its own -> (answers, their lengths in tokens)."""
    from PIL import Image

    model, processor = vlm
    answers, lengths = [], []
    for start in range(0, len(records), batch):
        chunk = records[start:start + batch]
        turns = [_user_turn(r) + (f"\n{instruction}" if instruction else "") for r in chunk]
        texts = [processor.apply_chat_template([{"role": "user", "content": turn}], add_generation_prompt=True)
                 for turn in turns]
        images = [Image.open(image_root / r["image"]).convert("RGB") for r in chunk]
        inputs = processor(images=images, text=texts, padding=True, return_tensors="pt").to(device)
        with torch.no_grad():
            output = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
        generated = output[:, inputs["input_ids"].shape[1]:]
        answers += processor.batch_decode(generated, skip_special_tokens=True)
        lengths += answer_lengths(generated, processor.tokenizer.eos_token_id)
    return answers, lengths


def _blind_scores(records: List[dict]) -> Dict[str, float]:
    """attribute -> share of records whose facts another record's true description of the same kind states:
    the accuracy of fluent descriptions blind to the image (averaged over up to 20 shifts)."""
    totals: Dict[str, List[float]] = {}
    for kind in vlm_scenes.ATTRIBUTES:
        group = [r for r in records if r["facts"]["kind"] == kind]
        for shift in range(1, min(len(group), 21)):
            for record, other in zip(group, group[shift:] + group[:shift]):
                stated = vlm_scenes.read_description(other["conversations"][1]["value"])
                for name, right in vlm_scenes.score(record["facts"], stated).items():
                    totals.setdefault(name, []).append(float(right))
    return {name: sum(values) / len(values) for name, values in totals.items()}


def _short_score(facts: dict, answer: str) -> Dict[str, bool]:
    return vlm_scenes.score(facts, vlm_scenes.read_description(answer))


def accuracy(records: List[dict], answers: List[str], scorer: Callable[[dict, str], Dict[str, bool]] = _short_score,
             chance: bool = True) -> dict:
    """Per attribute: the share of descriptions stating it right (by `scorer`), how many were scored, and chance."""
    hits: Dict[str, List[bool]] = {}
    for record, answer in zip(records, answers):
        for name, right in scorer(record["facts"], answer).items():
            hits.setdefault(name, []).append(right)
    blind = _blind_scores(records) if chance else {}
    return {name: {"accuracy": round(sum(values) / len(values), 4), "n": len(values),
                   **({"chance": round(blind.get(name, 0.0), 4)} if chance else {})} for name, values in hits.items()}


def length_summary(lengths: List[int], limit: int) -> dict:
    """The distribution of answer lengths (tokens), and the share of them at `limit`."""
    ordered = sorted(lengths)
    if not ordered:
        return {"answers": 0}
    return {"answers": len(ordered), "mean": round(statistics.fmean(ordered), 1), "median": statistics.median(ordered),
            "p10": ordered[len(ordered) // 10], "p90": ordered[min(len(ordered) - 1, len(ordered) * 9 // 10)],
            "max": ordered[-1], "at_limit": round(sum(n >= limit for n in ordered) / len(ordered), 4)}


def long_answers(vlm, records: List[dict], root: Path, device: str, plain_lengths: List[int], max_new_tokens: int,
                 batch: int) -> dict:
    """accuracy.json's `long` section: the records answered with the instruction, their lengths beside the plain
    answers' to the same prompts, and every attribute the long answers state (vlm_long.score_long)."""
    answers, lengths = describe_images(vlm, records, root, device, max_new_tokens, batch, vlm_long.INSTRUCTION)
    return {"instruction": vlm_long.INSTRUCTION, "images": len(records), "max_new_tokens": max_new_tokens,
            "lengths": {"without": length_summary(plain_lengths[:len(records)], max_new_tokens),
                        "with": length_summary(lengths, max_new_tokens)},
            "attributes": accuracy(records, answers, vlm_long.score_long, chance=False),
            "examples": [{"image": r["image"], "answer": a} for r, a in list(zip(records, answers))[:2]]}


def determined_answers(vlm, prompt_set: Path, model_dir: Path, device: str, max_new_tokens: int, batch: int) -> dict:
    """accuracy.json's `determined` section: the determined test set's questions answered with the long-answer
    instruction (as the ViSpec suite asks them), scored item by item per kind (vlm_determined.accuracy)."""
    records = read_prompt_set(prompt_set)
    answers, lengths = describe_images(vlm, records, prompt_set.parent, device, max_new_tokens, batch,
                                       vlm_long.INSTRUCTION)
    return {"prompt_set": str(prompt_set.relative_to(model_dir)), "images": len(records),
            "instruction": vlm_long.INSTRUCTION, "max_new_tokens": max_new_tokens,
            "lengths": length_summary(lengths, max_new_tokens), "kinds": vlm_determined.accuracy(records, answers),
            "scoring": "an item is right when the answer's line for it states it exactly as drawn (a grid cell's "
                       "colour and shape or `empty`, a word, a bar's colour and value); chance: the true listing of "
                       "another held-out image of the kind",
            "examples": [{"image": r["image"], "truth": r["conversations"][1]["value"], "answer": a}
                         for r, a in list(zip(records, answers))[:6]]}


def evaluate(model_dir: Path, prompt_set: Path, device: str, max_new_tokens: int, batch: int, long_prompts: int = 0,
             long_max_new_tokens: int = 512, determined_set: Optional[Path] = None,
             determined_max_new_tokens: int = 128) -> dict:
    """accuracy.json's content: the saved model's descriptions of a prompt set's images, scored; with
    `long_prompts`, the first that many answered at length too (`long_answers`); with `determined_set`, its
    determined questions answered and scored (`determined_answers`)."""
    records = read_prompt_set(prompt_set)
    vlm = load_vlm(model_dir, device)
    answers, lengths = describe_images(vlm, records, prompt_set.parent, device, max_new_tokens, batch)
    long = long_answers(vlm, records[:long_prompts], prompt_set.parent, device, lengths, long_max_new_tokens, batch) \
        if long_prompts else None
    determined = determined_answers(vlm, determined_set, model_dir, device, determined_max_new_tokens, batch) \
        if determined_set is not None else None
    return {"prompt_set": str(prompt_set.relative_to(model_dir)), "images": len(records),
            "attributes": accuracy(records, answers), "long": long, "determined": determined,
            "scoring": "an attribute is right when the description states it exactly as the drawn scene has it "
                       "(colours, shapes: the multiset over all shapes; objects: every colour-shape-position "
                       "triple); chance: the same score for the true description of another held-out image of "
                       "the same kind (fluent, blind to this image)",
            "examples": [{"image": r["image"], "truth": r["conversations"][1]["value"], "answer": a}
                         for r, a in list(zip(records, answers))[:8]]}


def accuracy_table(result: dict) -> str:
    lines = ["| attribute | accuracy | chance | n |", "|---|---|---|---|"]
    for name, row in result["attributes"].items():
        lines.append(f"| {name} | {row['accuracy']:.3f} | {row['chance']:.3f} | {row['n']} |")
    return "\n".join(lines)


def determined_table(result: dict) -> str:
    """The `determined` section as markdown ('' without one)."""
    determined = result.get("determined")
    return vlm_determined.accuracy_table(determined["kinds"]) if determined else ""


def long_table(result: dict) -> str:
    """The `long` section as markdown: answer lengths with and without the instruction, then the long answers'
    accuracy per attribute."""
    long = result.get("long")
    if not long:
        return ""
    lines = ["| answers | n | mean | median | p10 | p90 | max | at the limit |", "|---|---|---|---|---|---|---|---|"]
    for label, key in (("without instruction", "without"), ("with instruction", "with")):
        row = long["lengths"][key]
        lines.append(f"| {label} | {row['answers']} | {row.get('mean', '-')} | {row.get('median', '-')} | "
                     f"{row.get('p10', '-')} | {row.get('p90', '-')} | {row.get('max', '-')} | "
                     f"{row.get('at_limit', '-')} |")
    lines += ["", "| attribute (long answers) | accuracy | n |", "|---|---|---|"]
    lines += [f"| {name} | {row['accuracy']:.3f} | {row['n']} |" for name, row in long["attributes"].items()]
    return "\n".join(lines)
