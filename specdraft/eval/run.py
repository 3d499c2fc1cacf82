"""Evaluate a draft: τ (tokens per draft-verify cycle, bonus included) and acceptance by position at T=0,
decoding through the runtime (the drafter a method writes once serves both), against the target's own greedy
output from Hugging Face `generate`, token for token (with the prompt's images, for an image prompt set on a
vision-language target). Writes eval.json and eval.png."""
from __future__ import annotations

import time
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import torch

from specdraft.core.console import loading, ticking
from specdraft.core.errors import SpecdraftError
from specdraft.core.io import check_writable, write_json
from specdraft.data.images import load_images
from specdraft.data.sources import load_conversations
from specdraft.config import RuntimeConfig
from specdraft.drafts import RECIPE_FILE, load_draft
from specdraft.eval.plot import plot_acceptance
from specdraft.recipes import load_recipe
from specdraft.runtime.load import build_runtime, resolve_device, runtime_target
from specdraft.runtime.plots import device_name
from specdraft.decoding.stats import acceptance_by_position, cycles_by_position
from specdraft.targets import load_target
from specdraft.targets.remote_code import with_remote_code
from specdraft.targets.vision import PromptInputs, image_model_inputs, image_prompt


def eval_prompts(target, cfg) -> List[Tuple[torch.Tensor, list]]:
    """The first user turn of each evaluated conversation, chat template applied -> ([1, P] id tensor, its images
    as PIL images: an image prompt set's, for a vision-language target)."""
    limit = None if cfg.max_prompts is None else cfg.skip_prompts + cfg.max_prompts
    conversations = load_conversations([cfg.prompts], limit)[cfg.skip_prompts:]
    prompts = []
    for conversation in conversations:
        first_user = next((m for m in conversation.messages if m["role"] == "user"), None)
        if first_user is None:
            continue
        images = load_images(conversation.images)
        prompts.append((torch.tensor([target.chat.ids([first_user], images, add_generation_prompt=True)]), images))
    if not prompts:
        raise SpecdraftError(f"no prompts with a user turn in {cfg.prompts} (skip_prompts={cfg.skip_prompts})")
    return prompts


def greedy_answer(target, prompt_ids: torch.Tensor, max_new_tokens: int, eos_ids: List[int],
                  images: Sequence = ()) -> List[int]:
    """The target's greedy answer to `prompt_ids` ([1, P]; with its images, PIL) with Hugging Face `generate` ->
    its token ids."""
    inputs = image_model_inputs(target.processor, target.model, prompt_ids.cpu(), [images]) if images else \
        {"input_ids": prompt_ids}
    out = target.model.generate(**inputs, attention_mask=torch.ones_like(prompt_ids), do_sample=False,
                                max_new_tokens=max_new_tokens, eos_token_id=eos_ids,
                                pad_token_id=target.tokenizer.pad_token_id)
    return out[0, prompt_ids.shape[1]:].tolist()


def run_eval(path: str | Path, out_dir: Optional[str | Path] = None, overrides: List[str] = (),
             trust_remote_code: bool = False) -> dict:
    """Decode eval.prompts with the draft through the runtime (a chain of eval.depth, no early exit,
    in eval.dtype) and check every answer against the target's own greedy answer from Hugging Face `generate`.
    The target's weights: runtime.quantization when an override sets it, else the draft's target.quantization
    (`runtime_target`): a quantized target's greedy answers are what the runtime must give.
    `trust_remote_code`: the command line's consent to run the target's own code (never read from PATH's files)."""
    with loading(f"loading draft {path}"):
        loaded, recipe, target_cfg, target, runtime = _loaded(path, overrides, trust_remote_code)
    cfg = recipe.eval
    out = check_writable(out_dir or path)  # before the work: a read-only disk is one line now, not after it
    device = resolve_device(cfg.device)
    prompts = [(ids.to(device), images) for ids, images in eval_prompts(target, cfg)]
    accepted, lossless_count, spec_seconds, greedy_seconds, new_tokens = [], 0, 0.0, 0.0, 0
    for prompt_ids, images in ticking(prompts, desc="eval", unit="prompt"):
        ids = prompt_ids[0].tolist()
        inputs = image_prompt(target.model, target.processor, ids, images, runtime.engine.max_len) if images else \
            PromptInputs(ids)
        result = runtime.engine.generate(ids, cfg.max_new_tokens, runtime.eos_ids, **inputs.engine_kwargs())
        spec_seconds += result.seconds
        started = time.perf_counter()
        reference = greedy_answer(target, prompt_ids, cfg.max_new_tokens, runtime.eos_ids, images)
        greedy_seconds += time.perf_counter() - started
        lossless_count += result.tokens == reference
        accepted += result.accepted
        new_tokens += len(result.tokens)
    report = _report(loaded, cfg, accepted, lossless_count, len(prompts), new_tokens, spec_seconds, greedy_seconds,
                     device_name(device), target_cfg.quantization)
    write_json(out / "eval.json", report)
    plot_acceptance(report, out / "eval.png")
    return report


def _loaded(path: str | Path, overrides: List[str], trust_remote_code: bool):
    """The draft, its recipe (with `overrides`), the target's settings and the target (runtime.quantization when an override sets it, else
    the draft's target.quantization) and the runtime eval decodes with (a chain of eval.depth, no
    early exit, in eval.dtype)."""
    loaded = load_draft(path, overrides, trust_remote_code=trust_remote_code)  # first: it says what is wrong with
    recipe = load_recipe(Path(path) / RECIPE_FILE, list(overrides), trust_remote_code)  # `path` (missing, not a draft)
    cfg = recipe.eval
    device = resolve_device(cfg.device)
    target_cfg = runtime_target(with_remote_code(loaded.target_config, trust_remote_code, f"the draft {path}"),
                                recipe.runtime)
    target = load_target(target_cfg, device=device, dtype=cfg.dtype)
    if target.info.vocab_size != loaded.target.vocab_size:
        raise SpecdraftError(f"draft was built for vocabulary {loaded.target.vocab_size}, target has "
                             f"{target.info.vocab_size}")
    runtime = build_runtime(loaded, target, RuntimeConfig(depth=cfg.depth, chain=True, exit_threshold=0.0,
                                                          device=cfg.device, dtype=cfg.dtype))
    runtime.engine.set_tree_scorer(None)  # no early exit: a draft's tree scorer would end chains too
    return loaded, recipe, target_cfg, target, runtime


def _report(loaded, cfg, accepted, lossless_count, num_prompts, new_tokens, spec_seconds, greedy_seconds,
            device: str, quantization: str) -> dict:
    cycles = max(1, len(accepted))
    return {
        "tau": sum(a + 1 for a in accepted) / cycles,
        "acceptance_by_position": acceptance_by_position(accepted, cfg.depth),
        "cycles_by_position": cycles_by_position(accepted, cfg.depth),
        "accepted_histogram": [accepted.count(a) for a in range(cfg.depth + 1)],
        "lossless": lossless_count == num_prompts,
        "lossless_prompts": lossless_count,
        "prompts": num_prompts,
        "cycles": len(accepted),
        "new_tokens": new_tokens,
        "seconds_speculative": spec_seconds,
        "seconds_greedy_hf": greedy_seconds,
        "settings": {"temperature": 0.0, "depth": cfg.depth, "drafting": "chain",
                     "max_new_tokens": cfg.max_new_tokens, "prompts": cfg.prompts, "dtype": cfg.dtype,
                     "method": loaded.spec.name, "skip_prompts": cfg.skip_prompts, "device": device,
                     "target": loaded.target_config.path, "draft": str(loaded.source),
                     "quantization": quantization},
    }
