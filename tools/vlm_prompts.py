"""Held-out drawn-image prompt sets for a VLM built by tools/build_small_vlm.py, and the accuracy of its
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
answers with the target); `facts` are what tools/vlm_scenes.py scores a description on. Splits: `distill`
(prompts to regenerate answers on, for draft training) and `test` (benches and this accuracy check), drawn from
seeds apart from each other and from the model's training scenes.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List

import torch

import vlm_scenes

SPLIT_SEEDS = {"distill": 1, "test": 2}
"""Offsets added to the build's seed (the training pool uses the seed itself)."""
README = """# Drawn-image prompt sets

Held-out images drawn by tools/vlm_scenes.py, never seen in training the VLM beside them. One JSON object a line:

    {"id": "test-00000", "image": "images/test-00000.png",
     "conversations": [{"from": "human", "value": "<image>\\nDescribe this image."},
                       {"from": "gpt", "value": "<the scene's true description>"}],
     "facts": {"kind": "shapes" | "word" | "chart", ...}}

`image` is relative to the JSONL file. The human turn places the image with `<image>` (LLaVA's form); the gpt
turn is a reference (distillation regenerates answers); `facts` are the scored attributes.
- distill.jsonl: prompts for regenerating answers with the VLM (draft training data)
- test.jsonl: prompts for benches and the accuracy check (accuracy.json beside the model)
"""


def prompt_record(split: str, number: int, scene: vlm_scenes.Scene) -> dict:
    name = f"{split}-{number:05d}"
    prompt = vlm_scenes.PROMPTS[number % len(vlm_scenes.PROMPTS)]
    return {"id": name, "image": f"images/{name}.png",
            "conversations": [{"from": "human", "value": f"<image>\n{prompt}"},
                              {"from": "gpt", "value": vlm_scenes.describe(scene)}],
            "facts": vlm_scenes.facts(scene)}


def write_prompt_sets(folder: Path, image_size: int, seed: int, counts: Dict[str, int]) -> Dict[str, Path]:
    """Draws and writes each split's images and JSONL under `folder`; split -> JSONL path."""
    (folder / "images").mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, count in counts.items():
        records = []
        for number, scene in enumerate(vlm_scenes.random_scenes(count, seed + SPLIT_SEEDS[split])):
            record = prompt_record(split, number, scene)
            vlm_scenes.draw(scene, image_size).save(folder / record["image"])
            records.append(record)
        paths[split] = folder / f"{split}.jsonl"
        paths[split].write_text("".join(json.dumps(record) + "\n" for record in records))
    (folder / "README.md").write_text(README)
    return paths


def read_prompt_set(path: Path) -> List[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _user_turn(record: dict) -> str:
    return next(turn["value"] for turn in record["conversations"] if turn["from"] == "human")


def describe_images(model_dir: Path, records: List[dict], image_root: Path, device: str, max_new_tokens: int,
                    batch: int) -> List[str]:
    """The saved VLM's greedy answers to each record's prompt over its image, loaded as any user loads a VLM."""
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(model_dir)
    processor.tokenizer.padding_side = "left"
    dtype = torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    answers = []
    for start in range(0, len(records), batch):
        chunk = records[start:start + batch]
        texts = [processor.apply_chat_template([{"role": "user", "content": _user_turn(r)}],
                                               add_generation_prompt=True) for r in chunk]
        images = [Image.open(image_root / r["image"]).convert("RGB") for r in chunk]
        inputs = processor(images=images, text=texts, padding=True, return_tensors="pt").to(device)
        with torch.no_grad():
            output = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
        answers += processor.batch_decode(output[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    return answers


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


def accuracy(records: List[dict], answers: List[str]) -> dict:
    """Per attribute: the share of descriptions stating it right, how many were scored, and chance."""
    hits: Dict[str, List[bool]] = {}
    for record, answer in zip(records, answers):
        for name, right in vlm_scenes.score(record["facts"], vlm_scenes.read_description(answer)).items():
            hits.setdefault(name, []).append(right)
    chance = _blind_scores(records)
    return {name: {"accuracy": round(sum(values) / len(values), 4), "n": len(values),
                   "chance": round(chance.get(name, 0.0), 4)} for name, values in hits.items()}


def evaluate(model_dir: Path, prompt_set: Path, device: str, max_new_tokens: int, batch: int) -> dict:
    """accuracy.json's content: the saved model's descriptions of a prompt set's images, scored."""
    records = read_prompt_set(prompt_set)
    answers = describe_images(model_dir, records, prompt_set.parent, device, max_new_tokens, batch)
    return {"prompt_set": str(prompt_set.relative_to(model_dir)), "images": len(records),
            "attributes": accuracy(records, answers),
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
