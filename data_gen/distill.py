"""Regenerate every assistant turn of the prompt sets with the target: `specdraft distill-data RECIPE`.

Writes the layout of `specdraft.data.format` under `distill.output_dir`. Conversations are cut into shards of
`distill.shard_size` (by position); each shard is generated turn by turn (turn k of every conversation that has
one, batched and length-sorted) and written atomically (temp dir + os.replace), so an interrupted run leaves only
whole shards and re-running the same command generates just the missing ones. Each shard reseeds from
`distill.seed + shard index`, so a resumed sampled run draws the same answers. `fingerprint.json` guards the
output dir against resuming with another target, prompt set or sampling setting.
"""
from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

import torch

from specdraft.config import DistillConfig, Recipe, save_recipe
from specdraft.data.format import ROW_FEATURES, counts_path, dataset_dir, shards_dir
from specdraft.data.sources import Conversation, load_conversations
from specdraft.errors import SpecdraftError
from specdraft.io import TMP_PREFIX, atomic_dir, write_json
from specdraft.target.load import eos_token_ids

log = logging.getLogger(__name__)

FINGERPRINT = "fingerprint.json"
ERRORS = "errors.jsonl"
SHARD_COUNTS = "counts.json"


@dataclass
class _Dialog:
    """A conversation being regenerated: `messages` get the target's answers as turns complete."""
    conversation: Conversation
    messages: List[dict]
    turns_done: int = 0
    problem: Optional[dict] = None
    finished: bool = False


@dataclass
class _Context:
    """What every shard needs: the target, the settings, the progress bar and generation speed."""
    model: torch.nn.Module
    tokenizer: object
    recipe: Recipe
    eos_ids: List[int]
    progress: object
    generated_tokens: int = 0
    generate_seconds: float = 0.0
    generate_kwargs: dict = field(default_factory=dict)


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def shard_path(out: Path, shard_index: int) -> Path:
    return shards_dir(out) / f"shard-{shard_index:05d}"


def template_ids(tokenizer, messages: List[dict], add_generation_prompt: bool = False) -> List[int]:
    """Token ids of the chat template applied to `messages` (transformers 5 may return a BatchEncoding)."""
    result = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=add_generation_prompt)
    return list(result["input_ids"] if hasattr(result, "keys") else result)


def problem_entry(conversation: Conversation, status: str, reason: str) -> dict:
    """One errors.jsonl entry; status is `error` or `skipped`."""
    return {"source": conversation.source, "index": conversation.index, "status": status, "reason": reason}


def _first_line(err: Exception) -> str:
    return f"{type(err).__name__}: {(str(err).splitlines() or [''])[0]}"


def _user_positions(messages: List[dict]) -> List[int]:
    return [i for i, message in enumerate(messages) if message["role"] == "user"]


def prompt_ids(tokenizer, messages: List[dict], turn: int) -> List[int]:
    """The templated prompt for user turn `turn`: messages up to that user turn plus the generation prompt."""
    return template_ids(tokenizer, messages[:_user_positions(messages)[turn] + 1], add_generation_prompt=True)


def precheck(tokenizer, conversations: Dict[int, Conversation], data) -> Dict[int, dict]:
    """Problems found before generating, by position; raises for a too-long prompt when data.too_long == error."""
    found = {}
    for position, conversation in conversations.items():
        if conversation.skip_reason:
            found[position] = problem_entry(conversation, "skipped", conversation.skip_reason)
            continue
        try:
            length = len(prompt_ids(tokenizer, conversation.messages, 0))
        except Exception as err:  # jinja templates raise their own errors (e.g. unsupported system role)
            found[position] = problem_entry(conversation, "error", f"chat template failed: {_first_line(err)}")
            continue
        if length < data.max_length:
            continue
        reason = f"prompt is {length} tokens, leaving no room for an answer within data.max_length={data.max_length}"
        if data.too_long == "error":
            raise SpecdraftError(f"conversation {conversation.index} of {conversation.source}: {reason}; "
                                 f"raise data.max_length or set data.too_long=skip")
        found[position] = problem_entry(conversation, "skipped", reason)
    return found


def generation_kwargs(cfg: DistillConfig, eos_ids: List[int], pad_id: int) -> dict:
    """model.generate arguments: greedy at temperature 0, else plain temperature/top-p sampling (no top-k or
    repetition penalty leaking in from the model's own generation_config)."""
    sampling = cfg.temperature > 0
    return {"max_new_tokens": cfg.max_new_tokens, "do_sample": sampling, "num_beams": 1,
            "temperature": cfg.temperature if sampling else 1.0, "top_p": cfg.top_p if sampling else 1.0,
            "top_k": 0 if sampling else 50, "repetition_penalty": 1.0,
            "eos_token_id": eos_ids, "pad_token_id": pad_id}


def left_pad(prompts: List[List[int]], pad_id: int, device) -> tuple:
    """-> input_ids [B, T], attention_mask [B, T], prompts right-aligned (left padding)."""
    width = max(len(ids) for ids in prompts)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, ids in enumerate(prompts):
        input_ids[row, width - len(ids):] = torch.tensor(ids, dtype=torch.long)
        attention_mask[row, width - len(ids):] = 1
    return input_ids.to(device), attention_mask.to(device)


def cut_at_eos(ids: List[int], eos_ids: List[int]) -> List[int]:
    """Generated ids up to (not including) the first EOS."""
    return ids[:next((i for i, token in enumerate(ids) if token in eos_ids), len(ids))]


def generate_answers(ctx: _Context, prompts: List[List[int]]) -> List[str]:
    """Decoded answers (special tokens skipped) of the target to a batch of templated prompts."""
    device = next(ctx.model.parameters()).device
    input_ids, attention_mask = left_pad(prompts, ctx.tokenizer.pad_token_id, device)  # [B, T]
    start = time.perf_counter()
    with torch.no_grad():
        output = ctx.model.generate(input_ids=input_ids, attention_mask=attention_mask, **ctx.generate_kwargs)
    answers = [cut_at_eos(row, ctx.eos_ids) for row in output[:, input_ids.shape[1]:].tolist()]  # [B, <=new]
    ctx.generate_seconds += time.perf_counter() - start
    ctx.generated_tokens += sum(len(ids) for ids in answers)
    ctx.progress.set_postfix(tok_s=f"{ctx.generated_tokens / max(ctx.generate_seconds, 1e-9):.0f}", refresh=False)
    return [ctx.tokenizer.decode(ids, skip_special_tokens=True) for ids in answers]


def _finish(ctx: _Context, dialog: _Dialog, failure: Optional[str] = None) -> None:
    if failure is not None:
        dialog.problem = problem_entry(dialog.conversation, "error", failure)
    dialog.finished = True
    ctx.progress.update(1)


def _answer_batch(ctx: _Context, batch: List[tuple], turn: int) -> None:
    """Generate turn `turn` for a batch of (dialog, prompt ids); a failing batch marks all its dialogs as errors."""
    try:
        answers = generate_answers(ctx, [ids for _, ids in batch])
    except Exception as err:  # OOM, CUDA or model errors: record and go on with the next batch
        for dialog, _ in batch:
            _finish(ctx, dialog, f"generation failed: {_first_line(err)}")
        return
    for (dialog, _), answer in zip(batch, answers):
        dialog.messages[_user_positions(dialog.messages)[turn] + 1]["content"] = answer
        dialog.turns_done += 1
        if dialog.turns_done == dialog.conversation.num_turns:
            _finish(ctx, dialog)


def _turn_prompts(ctx: _Context, dialogs: List[_Dialog], turn: int) -> List[tuple]:
    """(dialog, prompt ids) of the unfinished dialogs with a user turn `turn`, longest first. A dialog whose
    prompt no longer fits data.max_length stops here (its later turns would be truncated away)."""
    max_length = ctx.recipe.data.max_length
    pending = []
    for dialog in dialogs:
        if dialog.finished or dialog.conversation.num_turns <= turn:
            continue
        try:
            ids = prompt_ids(ctx.tokenizer, dialog.messages, turn)
        except Exception as err:  # jinja template errors
            _finish(ctx, dialog, f"chat template failed at turn {turn}: {_first_line(err)}")
            continue
        if turn > 0 and len(ids) >= max_length:
            _finish(ctx, dialog)
        else:
            pending.append((dialog, ids))
    return sorted(pending, key=lambda item: -len(item[1]))


def loss_mask_row(tokenizer, messages: List[dict], max_length: int) -> tuple:
    """-> (input_ids, loss_mask) of the whole conversation, 1 on each assistant span, truncated to max_length.

    Span i is [len(template(messages[:i]) + generation prompt), len(template(messages[:i+1]))); both must be
    prefixes of the whole conversation's tokens, else ValueError (a template that rewrites earlier turns).
    """
    input_ids = template_ids(tokenizer, messages)
    loss_mask = [0] * len(input_ids)
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = template_ids(tokenizer, messages[:i], add_generation_prompt=True)
        through = template_ids(tokenizer, messages[:i + 1])
        if input_ids[:len(before)] != before or input_ids[:len(through)] != through:
            raise ValueError(f"chat template is not prefix-consistent at message {i}")
        loss_mask[len(before):len(through)] = [1] * (len(through) - len(before))
    return input_ids[:max_length], loss_mask[:max_length]


def _row(ctx: _Context, dialog: _Dialog) -> dict:
    """One ROW_FEATURES row: the regenerated turns only (a conversation may have stopped early on length)."""
    answered = dialog.messages[:_user_positions(dialog.messages)[dialog.turns_done - 1] + 2]
    input_ids, loss_mask = loss_mask_row(ctx.tokenizer, answered, ctx.recipe.data.max_length)
    cfg = ctx.recipe.distill
    return {"input_ids": input_ids, "loss_mask": loss_mask, "source": dialog.conversation.source,
            "index": dialog.conversation.index, "turns": dialog.turns_done, "target": ctx.recipe.target.path,
            "target_revision": ctx.recipe.target.revision or "", "temperature": cfg.temperature,
            "top_p": cfg.top_p, "seed": cfg.seed, "max_new_tokens": cfg.max_new_tokens}


def distill_shard(ctx: _Context, dialogs: List[_Dialog], shard_index: int) -> tuple:
    """Regenerate one shard turn by turn -> (rows, problems), in conversation order."""
    torch.manual_seed(ctx.recipe.distill.seed + shard_index)
    batch_size = ctx.recipe.distill.batch_size
    for turn in range(max((d.conversation.num_turns for d in dialogs), default=0)):
        pending = _turn_prompts(ctx, dialogs, turn)
        for start in range(0, len(pending), batch_size):
            _answer_batch(ctx, pending[start:start + batch_size], turn)
    rows, problems = [], []
    for dialog in dialogs:
        if dialog.problem is None:
            try:
                rows.append(_row(ctx, dialog))
            except Exception as err:  # template errors while building the row
                dialog.problem = problem_entry(dialog.conversation, "error", f"row failed: {_first_line(err)}")
        if dialog.problem is not None:
            problems.append(dialog.problem)
    return rows, problems


def _dialogs(ctx: _Context, conversations: Dict[int, Conversation], early: Dict[int, dict]) -> List[_Dialog]:
    dialogs = []
    for position, conversation in conversations.items():
        messages = [dict(message) for message in conversation.messages]
        dialog = _Dialog(conversation, messages, problem=early.get(position))
        if dialog.problem is not None:
            dialog.finished = True
            ctx.progress.update(1)
        dialogs.append(dialog)
    return dialogs


@contextmanager
def _quiet_datasets():
    """Silence `datasets`' own progress bars (they would tear through the distill bar)."""
    from datasets.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    was_disabled = are_progress_bars_disabled()
    disable_progress_bars()
    try:
        yield
    finally:
        if not was_disabled:
            enable_progress_bars()


def _save_dataset(dataset, directory: Path) -> None:
    """save_to_disk; an empty dataset still gets one (empty) Arrow file, so load_from_disk reads it back."""
    with _quiet_datasets():
        dataset.save_to_disk(str(directory), num_shards=1 if len(dataset) == 0 else None)


def write_shard(out: Path, shard_index: int, rows: List[dict], problems: List[dict]) -> Path:
    """Write a shard (rows, its errors.jsonl and counts.json) in a temp dir and rename it into place."""
    from datasets import Dataset

    columns = {name: [row[name] for row in rows] for name in ROW_FEATURES}
    statuses = [item["status"] for item in problems]
    counts = {"input": len(rows) + len(problems), "ok": len(rows), "error": statuses.count("error"),
              "skipped": statuses.count("skipped")}
    with atomic_dir(shard_path(out, shard_index)) as tmp:
        _save_dataset(Dataset.from_dict(columns, features=ROW_FEATURES), tmp)
        write_json(tmp / ERRORS, problems)
        write_json(tmp / SHARD_COUNTS, counts)
    return shard_path(out, shard_index)


def merge_shards(out: Path, num_shards: int, num_input: int) -> dict:
    """Concatenate all shards into dataset/, merge their counts and errors; -> counts."""
    from datasets import concatenate_datasets, load_from_disk

    counts = {"input": 0, "ok": 0, "error": 0, "skipped": 0}
    problems, parts = [], []
    for shard_index in range(num_shards):
        path = shard_path(out, shard_index)
        shard_counts = json.loads((path / SHARD_COUNTS).read_text())
        counts = {key: counts[key] + shard_counts[key] for key in counts}
        problems += [json.loads(line) for line in (path / ERRORS).read_text().splitlines() if line.strip()]
        with _quiet_datasets():
            parts.append(load_from_disk(str(path)))
    assert counts["input"] == num_input, f"shards hold {counts['input']} conversations, expected {num_input}"
    assert counts["ok"] + counts["error"] + counts["skipped"] == counts["input"], counts
    with atomic_dir(dataset_dir(out)) as tmp:
        _save_dataset(concatenate_datasets(parts), tmp)
    write_json(out / ERRORS, problems)
    write_json(counts_path(out), counts)
    return counts


def fingerprint(recipe: Recipe, conversations: List[Conversation]) -> dict:
    """What makes two runs' shards interchangeable, keyed by recipe field (plus a digest of the prompts)."""
    digest = hashlib.sha256()
    for conversation in conversations:
        digest.update(json.dumps([conversation.source, conversation.index, conversation.messages]).encode())
    cfg, data, target = recipe.distill, recipe.data, recipe.target
    values = {"target.path": target.path, "target.revision": target.revision, "target.dtype": target.dtype,
              "data.prompts": list(data.prompts), "data.max_samples": data.max_samples,
              "prompt contents": digest.hexdigest(), "data.max_length": data.max_length,
              "data.too_long": data.too_long, "distill.shard_size": cfg.shard_size,
              "distill.max_new_tokens": cfg.max_new_tokens, "distill.temperature": cfg.temperature,
              "distill.top_p": cfg.top_p, "distill.seed": cfg.seed}
    return json.loads(json.dumps(values))


def check_fingerprint(out: Path, expected: dict) -> None:
    """Refuse to resume into an output dir whose finished shards came from other settings."""
    path = out / FINGERPRINT
    if not path.is_file() or not any(shards_dir(out).glob("shard-*")):
        return
    previous = json.loads(path.read_text())
    changed = [key for key in sorted(set(expected) | set(previous)) if previous.get(key) != expected.get(key)]
    if changed:
        raise SpecdraftError(f"{out} holds shards distilled with a different {', '.join(changed)}; "
                             f"use a new distill.output_dir (or delete {out})")


def claim_output_dir(recipe: Recipe, out: Path, expected: dict) -> None:
    """Create the layout, drop temp dirs of interrupted runs, write the fingerprint and the resolved recipe."""
    shards_dir(out).mkdir(parents=True, exist_ok=True)
    for stale in [*shards_dir(out).glob(TMP_PREFIX + "*"), *out.glob(TMP_PREFIX + "*")]:
        shutil.rmtree(stale) if stale.is_dir() else stale.unlink()
    write_json(out / FINGERPRINT, expected)
    save_recipe(recipe, out)


def check_distill_config(cfg: DistillConfig) -> None:
    for name in ("max_new_tokens", "batch_size", "shard_size"):
        if getattr(cfg, name) < 1:
            raise SpecdraftError(f"distill.{name} must be at least 1, got {getattr(cfg, name)}")
    if cfg.temperature < 0:
        raise SpecdraftError(f"distill.temperature must be >= 0 (0 is greedy), got {cfg.temperature}")
    if not 0 < cfg.top_p <= 1:
        raise SpecdraftError(f"distill.top_p must be in (0, 1], got {cfg.top_p}")


def _generate_missing(recipe: Recipe, out: Path, conversations: List[Conversation], pending: List[int],
                      expected: dict, device: str) -> dict:
    """Load the target, check the prompts of the missing shards, then generate and write each of them.

    Returns this run's generation throughput: answer tokens, seconds inside generate, tokens/s."""
    from tqdm.auto import tqdm

    from specdraft.target.load import load_target

    size = recipe.distill.shard_size
    shards = {i: {p: conversations[p] for p in range(i * size, min((i + 1) * size, len(conversations)))}
              for i in pending}  # shard index -> {position: conversation}
    log.info("distilling %d of %d shards on %s", len(shards), -(-len(conversations) // size), device)
    target = load_target(recipe.target, device)
    early = precheck(target.tokenizer, {p: c for shard in shards.values() for p, c in shard.items()}, recipe.data)
    claim_output_dir(recipe, out, expected)
    eos_ids = eos_token_ids(target.model, target.tokenizer)
    done = len(conversations) - sum(len(shard) for shard in shards.values())
    with tqdm(total=len(conversations), initial=done, unit="prompt", desc="distill") as progress:
        ctx = _Context(target.model, target.tokenizer, recipe, eos_ids, progress,
                       generate_kwargs=generation_kwargs(recipe.distill, eos_ids, target.tokenizer.pad_token_id))
        for shard_index, shard in shards.items():
            rows, problems = distill_shard(ctx, _dialogs(ctx, shard, early), shard_index)
            write_shard(out, shard_index, rows, problems)
    return {"device": device, "shards": len(shards), "generated_tokens": ctx.generated_tokens,
            "generate_seconds": ctx.generate_seconds,
            "tokens_per_s": ctx.generated_tokens / max(ctx.generate_seconds, 1e-9)}


def run_distill(recipe: Recipe, device: Optional[str] = None) -> dict:
    """Regenerate the answers of `recipe.data.prompts` with `recipe.target` into `recipe.distill.output_dir`.

    Resumable: shards already on disk are kept. Returns {"input", "ok", "error", "skipped"} (also counts.json).
    """
    check_distill_config(recipe.distill)
    out = Path(recipe.distill.output_dir).expanduser()
    conversations = load_conversations(list(recipe.data.prompts), recipe.data.max_samples)
    expected = fingerprint(recipe, conversations)
    check_fingerprint(out, expected)
    num_shards = -(-len(conversations) // recipe.distill.shard_size)
    pending = [i for i in range(num_shards) if not shard_path(out, i).is_dir()]
    if pending:
        throughput = _generate_missing(recipe, out, conversations, pending, expected, device or default_device())
        write_json(out / "throughput.json", throughput)
    else:
        claim_output_dir(recipe, out, expected)
    counts = merge_shards(out, num_shards, len(conversations))
    if recipe.data.features == "offline":  # the target's hidden states beside each dataset (data_gen/features.py)
        from data_gen.features import dump_all_features

        dump_all_features(recipe, out, device)
    print(f"distilled {counts['input']} conversations: {counts['ok']} ok, {counts['error']} error, "
          f"{counts['skipped']} skipped -> {dataset_dir(out)}")
    return counts
