"""Regenerate every assistant turn of the prompt sets with the target: `specdraft distill-data RECIPE`.

Writes the layout of `specdraft.data.format` under `distill.output_dir`. Conversations are cut into shards of
`distill.shard_size` (by position); each shard is generated turn by turn (turn k of every conversation that has
one, batched and length-sorted) and written atomically (temp dir + os.replace), so an interrupted run leaves only
whole shards and re-running the same command generates just the missing ones. Each shard reseeds from
`distill.seed + shard index`, so a resumed sampled run draws the same answers. `fingerprint.json` guards the
output dir against resuming with another target, prompt set or sampling setting.

Several workers (GPUs, nodes, SLURM array tasks) share one output dir: each writes only the shards it owns
(specdraft/distill/workers.py), and the one that finds all shards on disk merges them (specdraft/distill/shards.py).

Image prompt sets (specdraft.data.sources) need a target that reads images (a vision-language target: its
processor templates the prompts and expands the images, specdraft.targets.chat). Each image is stored once
under the output dir by its content hash (specdraft.data.images) and rows name it; a missing or unreadable image
is its conversation's counted error, naming the file. `distill.answer_instruction` is appended to every user turn
before regeneration (ViSpec's "answer at length"), and stays in the rows as the target saw it.
"""
from __future__ import annotations

import hashlib
import json
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

import torch

from specdraft.config import DistillConfig, Recipe
from specdraft.recipes import save_recipe
from specdraft.distill.engine import StaticAnswers, static_engine
from specdraft.distill.server import ServerAnswers, ServerUnavailable
from specdraft.distill.shards import (
    CUT,
    merge_shards,
    missing_shards,
    remove_stale_temps,
    shard_path,
    throughput_path,
    write_shard,
)
from specdraft.distill.image_prompts import check_images, open_images, stored_images, with_instruction
from specdraft.distill.workers import local_device_index, resolve_worker, worker_shards
from specdraft.data.format import IMAGE_ROW_FEATURES, ROW_FEATURES, dataset_dir, shards_dir
from specdraft.data.images import UnreadableImage
from specdraft.data.sources import Conversation, load_conversations
from specdraft.core.errors import Interrupted, SpecdraftError, error_summary
from specdraft.core.io import check_output_dir, directory_lock, make_dirs, reading, write_json
from specdraft.methods import get_method
from specdraft.methods.base import RecordContext
from specdraft.targets.chat import TextChat
from specdraft.targets.generate import GREEDY, cut_at_eos, left_pad
from specdraft.targets.load import eos_token_ids, is_vision_target, load_chat_tokenizer
from specdraft.targets.vision import image_model_inputs

log = logging.getLogger(__name__)

FINGERPRINT = "fingerprint.json"


@dataclass
class _Dialog:
    """A conversation being regenerated: `messages` get the target's answers as turns complete."""
    conversation: Conversation
    messages: List[dict]
    turns_done: int = 0
    problem: Optional[dict] = None
    finished: bool = False
    images: list = field(default_factory=list)
    """The conversation's images (PIL), opened for this shard."""
    stored: List[str] = field(default_factory=list)
    """Their names under the output dir (specdraft.data.images)."""
    cuts: List[dict] = field(default_factory=list)
    """Its answers the server cut at a length limit (distill.engine=server): the shard's cut.jsonl entries."""


@dataclass
class _Context:
    """What every shard needs: the target, the settings, the progress bar and generation speed."""
    model: torch.nn.Module
    chat: TextChat
    recipe: Recipe
    eos_ids: List[int]
    progress: object
    generated_tokens: int = 0
    generate_seconds: float = 0.0
    generate_kwargs: dict = field(default_factory=dict)
    static: Optional[StaticAnswers] = None  # distill.engine's static engine; None: Hugging Face generate
    server: Optional[ServerAnswers] = None  # distill.engine=server's engine (then `model` is None)


def default_device() -> str:
    """The first GPU, or this worker's GPU among the visible ones under torchrun or srun; else the CPU."""
    if not torch.cuda.is_available():
        return "cpu"
    return f"cuda:{local_device_index() % torch.cuda.device_count()}"


def problem_entry(conversation: Conversation, status: str, reason: str) -> dict:
    """One errors.jsonl entry; status is `error` or `skipped`."""
    return {"source": conversation.source, "index": conversation.index, "status": status, "reason": reason}


def _user_positions(messages: List[dict]) -> List[int]:
    return [i for i, message in enumerate(messages) if message["role"] == "user"]


def prompt_ids(chat: TextChat, messages: List[dict], turn: int, images=()) -> List[int]:
    """The templated prompt for user turn `turn`: messages up to that user turn plus the generation prompt (a
    vision-language target's: with the conversation's images expanded)."""
    return chat.ids(messages[:_user_positions(messages)[turn] + 1], images, add_generation_prompt=True)


def _prompt_length(chat: TextChat, conversation: Conversation) -> int:
    """Tokens of the first turn's prompt, its images opened (and expanded) to count them."""
    return len(prompt_ids(chat, conversation.messages, 0, open_images(conversation)))


def precheck(chat: TextChat, conversations: Dict[int, Conversation], data) -> Dict[int, dict]:
    """Problems found before generating, by position; raises for a too-long prompt when data.too_long == error.
    A missing or unreadable image is its conversation's error."""
    check_images(chat, conversations)
    found = {}
    for position, conversation in conversations.items():
        if conversation.skip_reason:
            found[position] = problem_entry(conversation, "skipped", conversation.skip_reason)
            continue
        try:
            length = _prompt_length(chat, conversation)
        except UnreadableImage as err:
            found[position] = problem_entry(conversation, "error", str(err))
            continue
        except Exception as err:  # jinja templates raise their own errors (e.g. unsupported system role)
            found[position] = problem_entry(conversation, "error", f"chat template failed: {error_summary(err)}")
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
    common = {"max_new_tokens": cfg.max_new_tokens, "eos_token_id": eos_ids, "pad_token_id": pad_id}
    if cfg.temperature <= 0:
        return {**common, **GREEDY}
    return {**common, "do_sample": True, "num_beams": 1, "temperature": cfg.temperature, "top_p": cfg.top_p,
            "top_k": 0, "repetition_penalty": 1.0}


def generate_answers(ctx: _Context, prompts: List[List[int]], images: Optional[List[list]] = None) -> List[str]:
    """Decoded answers (special tokens skipped) of the target to a batch of templated prompts, by the engine
    distill.engine chose (engine.py); with each prompt's images (PIL) for a vision-language target, whose
    ids expand them already (Hugging Face generate: the static engine takes no images)."""
    start = time.perf_counter()
    answers = ctx.static.answers(prompts) if ctx.static is not None else hf_answers(ctx, prompts, images)  # [B, <=new]
    ctx.generate_seconds += time.perf_counter() - start
    ctx.generated_tokens += sum(len(ids) for ids in answers)
    ctx.progress.set_postfix(tok_s=f"{ctx.generated_tokens / max(ctx.generate_seconds, 1e-9):.0f}", refresh=False)
    return [ctx.chat.tokenizer.decode(ids, skip_special_tokens=True) for ids in answers]


def hf_answers(ctx: _Context, prompts: List[List[int]], images: Optional[List[list]] = None) -> List[List[int]]:
    """Hugging Face `generate` on the left-padded batch (with each row's images) -> each answer's ids up to its
    first EOS."""
    device = next(ctx.model.parameters()).device
    input_ids, attention_mask = left_pad(prompts, ctx.chat.tokenizer.pad_token_id, device)  # [B, T]
    inputs = {"input_ids": input_ids}
    if images is not None:
        inputs = image_model_inputs(ctx.chat.processor, ctx.model, input_ids.cpu(), images)
    with torch.no_grad():
        output = ctx.model.generate(**inputs, attention_mask=attention_mask, **ctx.generate_kwargs)
    return [cut_at_eos(row, ctx.eos_ids) for row in output[:, input_ids.shape[1]:].tolist()]


def _calls(ctx: _Context, pending: List[tuple]) -> List[List[tuple]]:
    """A turn's (dialog, prompt ids) as generate_answers takes them: distill.batch_size at a time for Hugging
    Face generate; all at once for the static engine, which keeps batch_size rows busy as answers finish."""
    size = max(len(pending), 1) if ctx.static is not None or ctx.server is not None else ctx.recipe.distill.batch_size
    return [pending[start:start + size] for start in range(0, len(pending), size)]


def _finish(ctx: _Context, dialog: _Dialog, failure: Optional[str] = None) -> None:
    if failure is not None:
        dialog.problem = problem_entry(dialog.conversation, "error", failure)
    dialog.finished = True
    ctx.progress.update(1)


def _answer_batch(ctx: _Context, batch: List[tuple], turn: int) -> None:
    """Generate turn `turn` for a batch of (dialog, prompt ids); a failing batch marks all its dialogs as errors."""
    if ctx.server is not None:
        return _server_batch(ctx, batch, turn)
    images = [dialog.images for dialog, _ in batch]
    try:
        answers = generate_answers(ctx, [ids for _, ids in batch], *([images] if any(images) else []))
    except Exception as err:  # OOM, CUDA or model errors: record and go on with the next batch
        for dialog, _ in batch:
            _finish(ctx, dialog, f"generation failed: {error_summary(err)}")
        return
    for (dialog, _), answer in zip(batch, answers):
        _record_answer(ctx, dialog, turn, answer)


def _record_answer(ctx: _Context, dialog: _Dialog, turn: int, answer: str) -> None:
    dialog.messages[_user_positions(dialog.messages)[turn] + 1]["content"] = answer
    dialog.turns_done += 1
    if dialog.turns_done == dialog.conversation.num_turns:
        _finish(ctx, dialog)


def _server_batch(ctx: _Context, batch: List[tuple], turn: int) -> None:
    """distill.engine=server: the turn's prompts all asked at once; a prompt the server refused is its own error
    (ServerUnavailable, the server gone, stops the run instead)."""
    for (dialog, _), answer in zip(batch, ctx.server.answers([ids for _, ids in batch])):
        if answer.failure is not None:
            _finish(ctx, dialog, answer.failure)
            continue
        if answer.cut is not None:
            dialog.cuts.append({"source": dialog.conversation.source, "index": dialog.conversation.index,
                                "turn": turn, "tokens": len(answer.ids), "reason": answer.cut})
        ctx.generated_tokens += len(answer.ids)
        _record_answer(ctx, dialog, turn, answer.text)


def _turn_prompts(ctx: _Context, dialogs: List[_Dialog], turn: int) -> List[tuple]:
    """(dialog, prompt ids) of the unfinished dialogs with a user turn `turn`, longest first. A dialog whose
    prompt no longer fits data.max_length stops here (its later turns would be truncated away)."""
    max_length = ctx.recipe.data.max_length
    pending = []
    for dialog in dialogs:
        if dialog.finished or dialog.conversation.num_turns <= turn:
            continue
        try:
            ids = prompt_ids(ctx.chat, dialog.messages, turn, dialog.images)
        except Exception as err:  # jinja template errors
            _finish(ctx, dialog, f"chat template failed at turn {turn}: {error_summary(err)}")
            continue
        if turn > 0 and len(ids) >= max_length:
            _finish(ctx, dialog)
        else:
            pending.append((dialog, ids))
    return sorted(pending, key=lambda item: -len(item[1]))


def loss_mask_row(chat: TextChat, messages: List[dict], max_length: int, images=()) -> tuple:
    """-> (input_ids, loss_mask) of the whole conversation, 1 on each assistant span, truncated to max_length.

    Span i is [len(template(messages[:i]) + generation prompt), len(template(messages[:i+1]))); both must be
    prefixes of the whole conversation's tokens, else ValueError (a template that rewrites earlier turns). The
    conversation's images (PIL) sit in its first user turn, so that every prefix holds them.
    """
    input_ids = chat.ids(messages, images)
    loss_mask = [0] * len(input_ids)
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = chat.ids(messages[:i], images, add_generation_prompt=True)
        through = chat.ids(messages[:i + 1], images)
        if input_ids[:len(before)] != before or input_ids[:len(through)] != through:
            raise ValueError(f"chat template is not prefix-consistent at message {i}")
        loss_mask[len(before):len(through)] = [1] * (len(through) - len(before))
    return input_ids[:max_length], loss_mask[:max_length]


def _row(ctx: _Context, dialog: _Dialog) -> dict:
    """One ROW_FEATURES row: the regenerated turns only (a conversation may have stopped early on length)."""
    answered = dialog.messages[:_user_positions(dialog.messages)[dialog.turns_done - 1] + 2]
    input_ids, loss_mask = loss_mask_row(ctx.chat, answered, ctx.recipe.data.max_length, dialog.images)
    cfg = ctx.recipe.distill
    row = {"input_ids": input_ids, "loss_mask": loss_mask, "source": dialog.conversation.source,
           "index": dialog.conversation.index, "turns": dialog.turns_done, "target": ctx.recipe.target.path,
           "target_revision": ctx.recipe.target.revision or "", "temperature": cfg.temperature,
           "top_p": cfg.top_p, "seed": cfg.seed, "max_new_tokens": cfg.max_new_tokens}
    return {**row, "images": dialog.stored} if ctx.chat.reads_images else row


def distill_shard(ctx: _Context, dialogs: List[_Dialog], shard_index: int) -> tuple:
    """Regenerate one shard turn by turn -> (rows, problems), in conversation order."""
    torch.manual_seed(ctx.recipe.distill.seed + shard_index)
    for turn in range(max((d.conversation.num_turns for d in dialogs), default=0)):
        for batch in _calls(ctx, _turn_prompts(ctx, dialogs, turn)):
            _answer_batch(ctx, batch, turn)
    rows, problems = [], []
    for dialog in dialogs:
        if dialog.problem is None:
            try:
                rows.append(_row(ctx, dialog))
            except Exception as err:  # template errors while building the row
                dialog.problem = problem_entry(dialog.conversation, "error", f"row failed: {error_summary(err)}")
        if dialog.problem is not None:
            problems.append(dialog.problem)
    return rows, problems


def _open_images(dialog: _Dialog, out: Path) -> None:
    """The dialog's images opened and stored under the output dir; an unreadable one is its problem."""
    try:
        dialog.images, dialog.stored = open_images(dialog.conversation), stored_images(dialog.conversation, out)
    except UnreadableImage as err:
        dialog.problem = problem_entry(dialog.conversation, "error", str(err))


def _dialogs(ctx: _Context, conversations: Dict[int, Conversation], early: Dict[int, dict],
             out: Path) -> List[_Dialog]:
    dialogs = []
    for position, conversation in conversations.items():
        messages = [dict(message) for message in conversation.messages]
        dialog = _Dialog(conversation, messages, problem=early.get(position))
        if dialog.problem is None and conversation.images:
            _open_images(dialog, out)
        if dialog.problem is not None:
            dialog.finished = True
            ctx.progress.update(1)
        dialogs.append(dialog)
    return dialogs


def fingerprint(recipe: Recipe, conversations: List[Conversation]) -> dict:
    """What makes two runs' shards interchangeable, keyed by recipe field (plus a digest of the prompts, and what
    a method that makes its own records names)."""
    digest = hashlib.sha256()
    for conversation in conversations:
        images = [conversation.images] if conversation.images else []  # text sets keep their digest
        digest.update(json.dumps([conversation.source, conversation.index, conversation.messages,
                                  *images]).encode())
    cfg, data, target = recipe.distill, recipe.data, recipe.target
    values = {"target.path": target.path, "target.revision": target.revision, "target.dtype": target.dtype,
              "data.prompts": list(data.prompts), "data.max_samples": data.max_samples,
              "prompt contents": digest.hexdigest(), "data.max_length": data.max_length,
              "data.too_long": data.too_long, "distill.shard_size": cfg.shard_size,
              "distill.max_new_tokens": cfg.max_new_tokens, "distill.temperature": cfg.temperature,
              "distill.top_p": cfg.top_p, "distill.seed": cfg.seed, "distill.answer_instruction": cfg.answer_instruction}
    records = get_method(recipe.method_name).records
    if records is not None:
        values["method records"] = {"method": recipe.method_name, **records.fingerprint(recipe.method)}
    return json.loads(json.dumps(values))


def check_fingerprint(out: Path, expected: dict) -> None:
    """Refuse to resume into an output dir whose finished shards came from other settings."""
    path = out / FINGERPRINT
    if not path.is_file() or not any(shards_dir(out).glob("shard-*")):
        return
    with reading(path, "fingerprint", f"use a new distill.output_dir (or delete {out})"):
        previous = json.loads(path.read_text())
    changed = [key for key in sorted(set(expected) | set(previous)) if previous.get(key) != expected.get(key)]
    if changed:
        raise SpecdraftError(f"{out} holds shards distilled with a different {', '.join(changed)}; "
                             f"use a new distill.output_dir (or delete {out})")


def claim_output_dir(recipe: Recipe, out: Path, expected: dict, own_shards: List[int]) -> None:
    """Create the layout, drop what interrupted writes of our own shards left, write the fingerprint and the
    resolved recipe (the same in every worker; each write is atomic)."""
    make_dirs(shards_dir(out))
    remove_stale_temps(out, own_shards)
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


def _shard_conversations(conversations: List[Conversation], shard_index: int, size: int) -> Dict[int, Conversation]:
    """{position: conversation} of one shard."""
    return {p: conversations[p] for p in range(shard_index * size, min((shard_index + 1) * size, len(conversations)))}


def _load_answerer(recipe: Recipe, device: str) -> tuple:
    """-> (target or None, chat, EOS ids, server engine or None). distill.engine=server loads the target's tokenizer
    alone and checks the server (before anything is written); every other engine loads the target."""
    if recipe.distill.engine != "server":
        from specdraft.targets.load import load_target

        target = load_target(recipe.target, device)
        return target, target.chat, eos_token_ids(target.model, target.tokenizer), None
    tokenizer, eos_ids = load_chat_tokenizer(recipe.target)
    chat = TextChat(tokenizer)
    try:
        probe = chat.ids([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    except Exception:  # noqa: BLE001 (a template that wants more than one user turn: plain text will do)
        probe = tokenizer.encode("Hi")
    return None, chat, eos_ids, ServerAnswers(recipe.distill, tokenizer, eos_ids).connect(probe)


def _first_prompts(chat: TextChat, shard: Dict[int, Conversation], early: Dict[int, dict]) -> List[List[int]]:
    """The first-turn prompts a shard will ask (those it can template), for the server engine to ask ahead."""
    prompts = []
    for position, conversation in shard.items():
        if position not in early and conversation.num_turns > 0:
            try:
                prompts.append(prompt_ids(chat, conversation.messages, 0))
            except Exception:  # noqa: BLE001 (the shard records the template's error itself)
                continue
    return prompts


def _write_shards(ctx: _Context, shards: Dict[int, Dict[int, Conversation]], early: Dict[int, dict],
                  out: Path) -> None:
    """Generate and write each shard in turn; the server engine asks the next shard's first turns meanwhile."""
    order = list(shards.items())
    features = IMAGE_ROW_FEATURES if ctx.chat.reads_images else ROW_FEATURES
    for position, (shard_index, shard) in enumerate(order):
        if ctx.server is not None:
            upcoming = _first_prompts(ctx.chat, order[position + 1][1], early) if position + 1 < len(order) else []
            ctx.server.start_shard(position, upcoming)
        dialogs = _dialogs(ctx, shard, early, out)
        rows, problems = distill_shard(ctx, dialogs, shard_index)
        cuts = [cut for dialog in dialogs if dialog.problem is None for cut in dialog.cuts]
        write_shard(out, shard_index, rows, problems, features, cut=cuts if ctx.server is not None else None)


def _generate_missing(recipe: Recipe, out: Path, conversations: List[Conversation], pending: List[int],
                      expected: dict, device: str, owned: int) -> dict:
    """Load the target (or, for distill.engine=server, its tokenizer and check the server), check the prompts of
    the missing shards, then generate and write each of them.

    `owned` is how many conversations this worker's shards hold (the progress bar's total). Returns this run's
    generation throughput: answer tokens, seconds inside generate (the server engine: from its first request to its
    last answer, with its requests' latencies), tokens/s, wall-clock start and end."""
    from tqdm.auto import tqdm

    instruction = recipe.distill.answer_instruction
    shards = {i: {p: with_instruction(c, instruction)
                  for p, c in _shard_conversations(conversations, i, recipe.distill.shard_size).items()}
              for i in pending}
    target, chat, eos_ids, server = _load_answerer(recipe, device)
    try:
        early = precheck(chat, {p: c for shard in shards.values() for p, c in shard.items()}, recipe.data)
        claim_output_dir(recipe, out, expected, pending)
        done = owned - sum(len(shard) for shard in shards.values())
        started = time.time()
        with tqdm(total=owned, initial=done, unit="prompt", desc="distill") as progress:
            ctx = _Context(None if target is None else target.model, chat, recipe, eos_ids, progress,
                           generate_kwargs=generation_kwargs(recipe.distill, eos_ids, chat.tokenizer.pad_token_id),
                           static=None if target is None else static_engine(recipe, target, eos_ids, device),
                           server=server)
            if server is not None:
                server.progress = progress
            _write_shards(ctx, shards, early, out)
    finally:
        served = server.close() if server is not None else None
    seconds = ctx.generate_seconds if served is None else served["seconds"]
    return {"device": device if served is None else f"server {served['url']}", "shards": len(shards),
            "generated_tokens": ctx.generated_tokens, "generate_seconds": seconds,
            "tokens_per_s": ctx.generated_tokens / max(seconds, 1e-9), "started": started, "finished": time.time(),
            **({} if served is None else {"server": served})}


def make_missing_records(recipe: Recipe, out: Path, conversations: List[Conversation], pending: List[int],
                         expected: dict, device: str, owned: int) -> dict:
    """`_generate_missing` for a method that makes its own records (MethodSpec.records): the target, the base draft
    it extends and the method's record maker loaded once, then each missing shard made and written."""
    from tqdm.auto import tqdm

    from specdraft.drafts import load_base, load_guide
    from specdraft.targets.load import load_target

    spec = get_method(recipe.method_name)
    shards = {i: _shard_conversations(conversations, i, recipe.distill.shard_size) for i in pending}
    target = load_target(recipe.target, device)
    early = precheck(target.chat, {p: c for shard in shards.values() for p, c in shard.items()}, recipe.data)
    claim_output_dir(recipe, out, expected, pending)
    done, started = owned - sum(len(shard) for shard in shards.values()), time.time()
    with tqdm(total=owned, initial=done, unit="prompt", desc=f"distill ({spec.name} records)") as progress:
        context = RecordContext(target=target, base=load_base(spec, recipe.method, target.info), device=device,
                                distill=recipe.distill, data=recipe.data, progress=progress.update,
                                guide=load_guide(spec, recipe.method, target.info))
        maker = spec.records.maker(recipe.method, context)
        for shard_index, shard in shards.items():
            torch.manual_seed(recipe.distill.seed + shard_index)
            rows, problems = maker.records({p: c for p, c in shard.items() if p not in early})
            problems += [early[p] for p in shard if p in early]
            progress.update(sum(p in early for p in shard))
            write_shard(out, shard_index, rows, problems, spec.records.features())
    return {"device": device, "shards": len(shards), "generated_tokens": 0, "generate_seconds": 0.0,
            "tokens_per_s": 0.0, "started": started, "finished": time.time()}


def _merge(out: Path, num_shards: int, num_input: int) -> dict:
    counts = merge_shards(out, num_shards, num_input)
    cut = len((out / CUT).read_text().splitlines()) if (out / CUT).is_file() else 0
    print(f"distilled {counts['input']} conversations: {counts['ok']} ok, {counts['error']} error, "
          f"{counts['skipped']} skipped -> {dataset_dir(out)}"
          + (f" ({cut} answer{'s' * (cut != 1)} cut at a length limit: {out / CUT})" if cut else ""), file=sys.stderr)
    return counts


def _dump_features(recipe: Recipe, out: Path, device: Optional[str]) -> None:
    """data.features=offline: the target's hidden states beside each dataset (specdraft/distill/features.py), written by
    the process that merged (after every worker's text shards exist)."""
    if recipe.data.features == "offline":
        from specdraft.distill.features import dump_all_features

        dump_all_features(recipe, out, device or default_device())


def merge_only(recipe: Recipe) -> dict:
    """`distill-data RECIPE --merge`: merge the shards the workers wrote; an error while some are missing."""
    out = Path(recipe.distill.output_dir).expanduser()
    conversations = load_conversations(list(recipe.data.prompts), recipe.data.max_samples)
    check_fingerprint(out, fingerprint(recipe, conversations))
    num_shards = -(-len(conversations) // recipe.distill.shard_size)
    missing = missing_shards(out, num_shards)
    if missing:
        names = ", ".join(shard_path(out, i).name for i in missing[:5]) + (", ..." if len(missing) > 5 else "")
        raise SpecdraftError(f"{len(missing)} of {num_shards} shards are missing in {shards_dir(out)} ({names}); "
                             f"run the distill-data workers first")
    return _merge(out, num_shards, len(conversations))


def _kept_shards(out: Path, own: List[int]) -> str:
    """What a Ctrl-C'd worker kept: each shard is written whole (a rename) or not at all."""
    kept = sum(shard_path(out, i).is_dir() for i in own)
    return (f"distill-data stopped with {kept} of its {len(own)} shards written in {shards_dir(out)}; run the same "
            f"command again to distill the other {len(own) - kept}")


def run_distill(recipe: Recipe, device: Optional[str] = None) -> dict:
    """Regenerate the answers of `recipe.data.prompts` with `recipe.target` into `recipe.distill.output_dir`.

    Writes only this worker's missing shards (all shards for a single worker; see specdraft/distill/workers.py). The
    worker that finds every shard on disk merges them and returns {"input", "ok", "error", "skipped"} (also
    counts.json); a worker that finishes before the others returns what it wrote and which shards are missing.
    """
    check_distill_config(recipe.distill)
    if recipe.distill.engine == "server" and get_method(recipe.method_name).records is not None:
        raise SpecdraftError(f"method {recipe.method_name} makes its own records with the target's forward, which "
                             f"distill.engine=server has not; use distill.engine=hf or static")
    if recipe.data.features == "offline" and is_vision_target(recipe.target):  # its images run with each batch
        raise SpecdraftError(f"target {recipe.target.path} is a vision-language model: its features are computed "
                             f"online, with each batch's images; set data.features=online")
    out = Path(recipe.distill.output_dir).expanduser()
    conversations = load_conversations(list(recipe.data.prompts), recipe.data.max_samples)
    expected = fingerprint(recipe, conversations)
    worker = resolve_worker(recipe.distill)
    with distill_lock(out, f"worker-{worker.index}-of-{worker.count}", expected):
        return _distill_locked(recipe, out, conversations, expected, worker, device)


def distill_lock(out: Path, slot: str, expected: dict):
    """One process a worker slot writes into `out`, and all of them with the same settings (`expected`); `out`
    must be new, empty or a distill-data output (specdraft.core.io.directory_lock, check_output_dir)."""
    check_output_dir(out, lambda path: any((path / name).exists() for name in (FINGERPRINT, "shards", "dataset")),
                     "a distill-data output", flag="")
    digest = hashlib.sha256(json.dumps(expected, sort_keys=True).encode()).hexdigest()[:16]
    return directory_lock(out, slot, "distill-data", {"fingerprint": digest}, peers_agree=True)


def _distill_locked(recipe: Recipe, out: Path, conversations: List[Conversation], expected: dict, worker,
                    device: Optional[str]) -> dict:
    check_fingerprint(out, expected)
    size = recipe.distill.shard_size
    num_shards = -(-len(conversations) // size)
    own = worker_shards(num_shards, worker)
    pending = [i for i in own if not shard_path(out, i).is_dir()]
    device = device or default_device()
    log.info("%s: %d of its %d shards to distill (of %d) on %s", worker, len(pending), len(own), num_shards, device)
    if pending:
        owned = sum(len(_shard_conversations(conversations, i, size)) for i in own)
        make = _generate_missing if get_method(recipe.method_name).records is None else make_missing_records
        try:
            throughput = make(recipe, out, conversations, pending, expected, device, owned)
        except KeyboardInterrupt:
            raise Interrupted(_kept_shards(out, own)) from None
        except ServerUnavailable as err:  # the server went away: what was written stays, the same command resumes
            raise SpecdraftError(f"{err}; {_kept_shards(out, own)}") from None
        write_json(throughput_path(out, worker.index, worker.count), {"worker": worker.index, **throughput})
    else:
        claim_output_dir(recipe, out, expected, [])
    missing = missing_shards(out, num_shards)
    if missing:
        print(f"{worker}: wrote {len(pending)} shards; {len(missing)} of {num_shards} shards still to come from "
              f"other workers (the last one to finish merges; or run distill-data RECIPE --merge)", file=sys.stderr)
        return {"worker": worker.index, "workers": worker.count, "shards_written": len(pending),
                "shards_missing": len(missing)}
    counts = _merge(out, num_shards, len(conversations))
    _dump_features(recipe, out, device)
    return counts
