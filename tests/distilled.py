"""A distilled dataset written directly in the on-disk format, from a tiny target's own greedy answers."""
from __future__ import annotations

from pathlib import Path

import numpy as np

import torch

from specdraft.data.format import ROW_FEATURES, dataset_dir


def write_distilled(distill_dir: Path, target_dir: Path, num_rows: int = 12, answer_tokens: int = 24) -> Path:
    """Greedy answers of the tiny target to short random prompts, with loss_mask on the answers."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target_dir).eval()
    generator = torch.Generator().manual_seed(1)
    rows = []
    for index in range(num_rows):
        prompt = torch.randint(0, 250, (1, 8), generator=generator)
        with torch.no_grad():
            out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=answer_tokens,
                                 do_sample=False, eos_token_id=None, pad_token_id=0, min_new_tokens=answer_tokens)
        ids = out[0].tolist()
        rows.append({"input_ids": ids, "loss_mask": [0] * 8 + [1] * (len(ids) - 8), "source": "tiny",
                     "index": index, "turns": 1, "target": str(target_dir), "target_revision": "",
                     "temperature": 0.0, "top_p": 1.0, "seed": 0, "max_new_tokens": answer_tokens})
    Dataset.from_list(rows, features=ROW_FEATURES).save_to_disk(str(dataset_dir(distill_dir)))
    return distill_dir


def write_distilled_images(distill_dir: Path, vlm_dir: Path, num_rows: int = 12, answer_tokens: int = 24) -> Path:
    """Greedy answers of a tiny VLM to image prompts (drawn images, stored by content hash as distill-data stores
    them), with loss_mask on the answers."""
    from datasets import Dataset

    from specdraft.config import TargetConfig
    from specdraft.data.format import IMAGE_ROW_FEATURES
    from specdraft.data.images import store_image
    from specdraft.targets import load_target
    from specdraft.targets.vision import image_model_inputs
    from tests.tiny_vlm import drawn_image

    target = load_target(TargetConfig(path=str(vlm_dir), dtype="float32"))
    (distill_dir / "drawn").mkdir(parents=True, exist_ok=True)
    rows = []
    for index in range(num_rows):
        image_file, image = distill_dir / "drawn" / f"{index}.png", drawn_image(index, (32 + 8 * (index % 3), 32))
        image.save(image_file)
        prompt = target.chat.ids([{"role": "user", "content": f"<image>\nQuestion {index}?"}], [image], True)
        inputs = image_model_inputs(target.processor, target.model, torch.tensor([prompt]), [[image]])
        with torch.no_grad():
            out = target.model.generate(**inputs, attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                        max_new_tokens=answer_tokens, min_new_tokens=answer_tokens, do_sample=False,
                                        eos_token_id=None, pad_token_id=0)
        ids = out[0].tolist()
        rows.append({"input_ids": ids, "loss_mask": [0] * len(prompt) + [1] * (len(ids) - len(prompt)),
                     "source": "tiny", "index": index, "turns": 1, "target": str(vlm_dir), "target_revision": "",
                     "temperature": 0.0, "top_p": 1.0, "seed": 0, "max_new_tokens": answer_tokens,
                     "images": [store_image(image_file, distill_dir)]})
    Dataset.from_list(rows, features=IMAGE_ROW_FEATURES).save_to_disk(str(dataset_dir(distill_dir)))
    return distill_dir


CHAT_PROMPTS = [f"question {i}?" for i in range(12)]
"""The prompts a chat-trained base draft (`train_chat_base`) has seen answered."""


def write_chat_distilled(distill_dir: Path, target_dir: Path, texts=CHAT_PROMPTS, answer_tokens: int = 24) -> Path:
    """The tiny target's greedy answers to chat-templated `texts`, as distill-data writes them."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(target_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    rows = []
    for index, text in enumerate(texts):
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                               return_dict=True)["input_ids"]
        ids = torch.tensor([prompt])
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=answer_tokens,
                                 do_sample=False, eos_token_id=None, pad_token_id=0, min_new_tokens=answer_tokens)
        full = out[0].tolist()
        rows.append({"input_ids": full, "loss_mask": [0] * len(prompt) + [1] * (len(full) - len(prompt)),
                     "source": "tiny-chat", "index": index, "turns": 1, "target": str(target_dir),
                     "target_revision": "", "temperature": 0.0, "top_p": 1.0, "seed": 0,
                     "max_new_tokens": answer_tokens})
    Dataset.from_list(rows, features=ROW_FEATURES).save_to_disk(str(dataset_dir(distill_dir)))
    return distill_dir


def train_chat_base(work: Path, target_dir: Path, steps: int = 40) -> Path:
    """An EAGLE-3 export of the tiny target trained on its answers to CHAT_PROMPTS (so that its trees are accepted
    on those prompts): a base for add-on methods -> the export directory."""
    from specdraft import cli
    from tests.test_train_export_eval import make_recipe  # here: that module imports this one

    recipe = make_recipe(work, target_dir, write_chat_distilled(work / "distilled", target_dir), max_steps=steps,
                         val_every_steps=steps)
    torch.manual_seed(0)
    assert cli.main(["train", str(recipe)]) == 0
    assert cli.main(["export", str(work / "run"), "--out", str(work / "export"), "--dtype", "float32"]) == 0
    return work / "export"


PACKED_LENGTHS = (9, 14, 6, 11)
"""The conversations' lengths in random_conversation_rows: two or three of them fit a packed row of 24."""


def random_conversation_rows(lengths=PACKED_LENGTHS) -> list:
    """Tokenized conversations of random ids (a third of each the prompt, loss_mask 0), for packing tests."""
    rng = np.random.default_rng(0)
    rows = []
    for length in lengths:
        loss_mask = np.ones(length, dtype=np.int64)
        loss_mask[: length // 3] = 0  # the prompt
        rows.append({"input_ids": rng.integers(0, 250, length), "loss_mask": loss_mask})
    return rows
