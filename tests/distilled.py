"""A distilled dataset written directly in the on-disk format, from a tiny target's own greedy answers."""
from __future__ import annotations

from pathlib import Path

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
