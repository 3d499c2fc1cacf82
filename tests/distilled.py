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
