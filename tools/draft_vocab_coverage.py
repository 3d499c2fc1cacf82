"""How much of the target's output a draft vocabulary can hold: the share of answer tokens inside the top-k draft
vocabulary that training would build (the k most frequent answer tokens of the recipe's distilled training rows,
`build_draft_vocab`), for several k. A token outside it can never be drafted, so it ends every accepted run it
falls in: at coverage c, no draft position is accepted more often than c.

Two columns per size: the training answers themselves, and the target's greedy answers to the recipe's
evaluation prompts (eval.prompts: MT-bench by default), generated here with Hugging Face `generate`.

    python -m tools.draft_vocab_coverage recipes/eagle3_smollm2.yaml distill.output_dir=RUN \\
        'train.extra_distilled=[RUN2]' --max-prompts 20 --sizes 4096,8192,16384,32768 --out runs/coverage

Prints the table and writes OUT/draft_vocab_coverage.json.
"""
from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path
from typing import Dict, List, Optional

import torch
from tqdm import tqdm


def coverage(token_ids: torch.Tensor, vocab: torch.Tensor) -> float:
    """Share of `token_ids` ([N]) that are in `vocab` ([K] target ids)."""
    return torch.isin(token_ids, vocab).float().mean().item()


def eval_answers(recipe, max_prompts: int, max_new_tokens: int, device: str) -> torch.Tensor:
    """The target's greedy answers to the first `max_prompts` evaluation prompts, concatenated -> [N] ids."""
    from specdraft.eval.run import eval_prompts, greedy_answer
    from specdraft.targets import load_target
    from specdraft.targets.load import eos_token_ids

    target = load_target(recipe.target, device, "float32" if device == "cpu" else "bfloat16")
    eos_ids = eos_token_ids(target.model, target.tokenizer)
    prompts = eval_prompts(target, dataclasses.replace(recipe.eval, max_prompts=max_prompts))
    answers = [greedy_answer(target, prompt.to(device), max_new_tokens, eos_ids, images)
               for prompt, images in tqdm(prompts, desc="greedy answers")]
    return torch.tensor([token for answer in answers for token in answer], dtype=torch.int64)


def main(argv: Optional[List[str]] = None) -> Dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe")
    parser.add_argument("overrides", nargs="*", help="key=value recipe overrides")
    parser.add_argument("--sizes", default="4096,8192,16384,32768", help="draft vocabulary sizes")
    parser.add_argument("--max-prompts", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    from specdraft.recipes import load_recipe
    from specdraft.core.io import write_json
    from specdraft.methods.shared import build_draft_vocab
    from specdraft.targets.load import load_target_info
    from specdraft.train.data import answer_token_counts, load_distilled, split_distilled

    recipe = load_recipe(args.recipe, args.overrides)
    distill_dirs = [recipe.distill.output_dir, *recipe.train.extra_distilled]
    dataset = load_distilled(distill_dirs)
    train_idx, _ = split_distilled(distill_dirs, len(dataset), recipe.data.val_fraction, recipe.train.seed)
    vocab_size = load_target_info(recipe.target).vocab_size
    counts = answer_token_counts(dataset, train_idx, vocab_size)  # [V]
    started = time.perf_counter()
    answers = eval_answers(recipe, args.max_prompts, args.max_new_tokens, args.device)  # [N]
    rows = []
    for size in (int(size) for size in args.sizes.split(",")):
        vocab = build_draft_vocab(counts, min(size, vocab_size))  # [K] target ids
        rows.append({"draft_vocab_size": size, "train_answers": float(counts[vocab].sum() / counts.sum()),
                     "eval_answers": coverage(answers, vocab)})
    report = {"recipe": args.recipe, "overrides": args.overrides, "eval_prompts": recipe.eval.prompts,
              "max_prompts": args.max_prompts, "max_new_tokens": args.max_new_tokens, "device": args.device,
              "target_vocab_size": vocab_size, "train_rows": len(train_idx), "train_answer_tokens": int(counts.sum()),
              "eval_answer_tokens": len(answers), "generate_seconds": time.perf_counter() - started, "rows": rows}
    print(f"{'draft vocab':>11} {'train answers':>14} {'eval answers':>13}")
    for row in rows:
        print(f"{row['draft_vocab_size']:>11} {100 * row['train_answers']:>13.2f}% {100 * row['eval_answers']:>12.2f}%")
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "draft_vocab_coverage.json", report)
    print(f"-> {args.out / 'draft_vocab_coverage.json'}")
    return report


if __name__ == "__main__":
    main()
