"""Build a runtime from a trained draft (an export or a run directory), its target and the runtime settings
(`specdraft.config.RuntimeConfig`: an export carries its recipe's, the CLI overrides them field by field).

Code from elsewhere never runs because a file asked for it: the target loads with `trust_remote_code` only when
the caller passes it (the CLI's `--trust-remote-code`), never from an export's or a checkpoint's settings.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import torch

from specdraft.config import RUNTIME_QUANTIZATIONS, ExitSettings, PolicySettings, PruneSettings, RuntimeConfig, \
    TargetConfig
from specdraft.core.drafting import IntermediateModel
from specdraft.core.errors import SpecdraftError
from specdraft.core.types import geometry_mismatch
from specdraft.drafts import RECIPE_FILE, LoadedDraft, load_draft
from specdraft.decoding.engine import EngineOptions, SpecEngine
from specdraft.decoding.hierarchy import CompactIntermediate
from specdraft.decoding.policies.adaptive import AdaptivePolicy
from specdraft.decoding.policies.base import DraftingPolicy
from specdraft.decoding.policies.ddd import ddd_policy
from specdraft.decoding.policies.dynamic_exit import ExitChoice
from specdraft.decoding.policies.sam import SamPolicy
from specdraft.decoding.policies.suffix_automaton import Retrieval, corpus_automaton
from specdraft.decoding.policies.svip import svip_policy
from specdraft.decoding.shapes import ADAPTIVE_DEPTH, CHAIN_DEPTH, SAMPLING_TREE, TreeShape
from specdraft.decoding.verifier import VerifierModel, from_hf, hf_rope_tables
from specdraft.runtime.draft_model import load_draft_model
from specdraft.targets import load_target
from specdraft.targets.load import LoadedTarget, eos_token_ids
from specdraft.targets.remote_code import with_remote_code
from specdraft.targets.vision import PromptInputs, image_prompt


@dataclass
class Runtime:
    engine: SpecEngine
    target: LoadedTarget  # the Hugging Face model and tokenizer (the `generate` baseline)
    draft: Optional[LoadedDraft]  # the trained draft (None: a target alone, runtime.draft_model drafting)
    eos_ids: List[int]
    settings: RuntimeConfig

    @property
    def method(self) -> str:
        """What drafts: the trained draft's method, or "draft_model" (runtime.draft_model)."""
        return "draft_model" if self.settings.draft_model else self.draft.spec.name

    @property
    def draft_source(self) -> str:
        """Where the drafting draft came from: the export or run directory, or runtime.draft_model."""
        return self.settings.draft_model or str(self.draft.source)

    def encode_chat(self, text: str) -> List[int]:
        """A user turn's token ids, chat template (or target.prompt_format's plain form) applied (a target without
        either: the text's own tokens)."""
        chat = self.target.chat
        if chat.forms_prompts:
            return chat.ids([{"role": "user", "content": text}], add_generation_prompt=True)
        return self.target.tokenizer(text)["input_ids"]

    def prompt(self, text: str, images: Sequence = ()) -> PromptInputs:
        """A user turn and its images (PIL; `<image>` in the text places each, else they come first) as the engine
        takes it: `engine.generate(p.ids, ..., **p.engine_kwargs())`. Images need a vision-language target."""
        if not images:
            return PromptInputs(self.encode_chat(text), text=text)
        ids = self.target.chat.ids([{"role": "user", "content": text}], images, add_generation_prompt=True)
        prompt = image_prompt(self.target.model, self.target.processor, ids, images, self.engine.max_len)
        prompt.text = text
        return prompt


def _check_geometry(loaded: LoadedDraft, target: LoadedTarget) -> None:
    mismatch = geometry_mismatch(loaded.target, target.info)
    if mismatch is not None:
        raise SpecdraftError(mismatch)


def resolve_device(device: str) -> torch.device:
    return torch.device(("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device)


def tree_shape(cfg: RuntimeConfig, block_size: int = 0) -> TreeShape:
    """The draft's shape: a chain of `depth` (default CHAIN_DEPTH) or a tree (depth, topk, budget; each unset one
    TreeShape's default, the depth ADAPTIVE_DEPTH under the adaptive policy: its deepest choice), checked
    (decoding/shapes.py holds the defaults). A block drafter's (`block_size` B > 0): the chain of its B - 1
    proposals unless a topk above 1 asks for a block tree, the depth B - 1 unless runtime.depth is set."""
    if block_size:
        depth = cfg.depth or block_size - 1
        if cfg.chain or cfg.topk in (None, 1):
            return TreeShape.chain(depth).validated()
        cfg = replace(cfg, depth=depth)
    if cfg.chain or cfg.topk == 1:
        return TreeShape.chain(cfg.depth or CHAIN_DEPTH).validated()
    depth = ADAPTIVE_DEPTH if cfg.policy == "adaptive" and cfg.depth is None else cfg.depth
    given = {"depth": depth, "topk": cfg.topk, "budget": cfg.budget}
    return TreeShape(**{name: value for name, value in given.items() if value is not None}).validated()


def sampling_tree_shape(cfg: RuntimeConfig) -> Optional[TreeShape]:
    """The fixed tree's own shape at T > 0: SAMPLING_TREE when the settings ask for no shape (depth, topk, budget
    and chain unset) and the cycle is the plain fixed tree (no drafting policy, intermediate model or shallow reuse);
    None otherwise (the one shape at every temperature)."""
    asked = (cfg.depth, cfg.topk, cfg.budget)
    if cfg.chain or any(value is not None for value in asked) or cfg.policy != "fixed" or cfg.intermediate \
            or cfg.shallow_reuse_tree:
        return None
    return SAMPLING_TREE


def runtime_target(target_cfg: TargetConfig, cfg: RuntimeConfig) -> TargetConfig:
    """The target the runtime (and eval) verifies with: the draft's, its weights as runtime.quantization says, else
    as its target.quantization does when every stage runs that (int8, int4; bitsandbytes' 8bit and 4bit quantize
    training features only: unquantized here)."""
    quantization = cfg.quantization or target_cfg.quantization
    return replace(target_cfg, quantization=quantization if quantization in RUNTIME_QUANTIZATIONS else "none")


def _intermediate(cfg: RuntimeConfig, target: LoadedTarget, target_model: VerifierModel,
                  max_len: int) -> Optional[IntermediateModel]:
    """runtime.intermediate loaded (None: off): a draft's export or run directory whose method serves as one
    (MethodSpec.intermediate), else a small Llama-family model of the target's vocabulary."""
    if cfg.intermediate is None:
        return None
    if (Path(cfg.intermediate) / RECIPE_FILE).is_file():  # an export or a training run
        loaded = load_draft(Path(cfg.intermediate))
        _check_geometry(loaded, target)
        if loaded.spec.intermediate is None:
            raise SpecdraftError(f"runtime.intermediate={cfg.intermediate}: a {loaded.spec.name} draft cannot check "
                                 f"a tree; give a draft that can (Kangaroo) or a small model of the target's vocabulary")
        draft = loaded.draft.to(device=target_model.device, dtype=target_model.dtype)
        return loaded.spec.intermediate(draft, loaded.method_cfg, target_model)
    small = load_target(TargetConfig(path=cfg.intermediate), device=target_model.device, dtype=cfg.dtype,
                        require_chat_template=False)
    if small.info.vocab_size != target.info.vocab_size:
        raise SpecdraftError(f"runtime.intermediate={cfg.intermediate} has a vocabulary of {small.info.vocab_size}; "
                             f"the target's is {target.info.vocab_size} (it must share the target's tokenizer)")
    return CompactIntermediate(from_hf(small.model, small.info), hf_rope_tables(small.model, max_len))


def engine_options(drafter, shape: TreeShape, cfg: RuntimeConfig, tokenizer=None,
                   intermediate: Optional[IntermediateModel] = None) -> EngineOptions:
    """SpecEngine's options from the settings; the chain-only ones are refused on a tree."""
    options = EngineOptions(reuse_shallow_tree=cfg.shallow_reuse_tree, overlap=cfg.overlap,
                            tree_scorer=_tree_scorer(drafter, cfg, chain=shape.topk == 1), judge=_judge(drafter, cfg),
                            sample_drafts=cfg.sample_drafts, prune_at=cfg.prune_at, prune_verify=cfg.prune_verify,
                            policy=drafting_policy(cfg, tokenizer), intermediate=intermediate,
                            sampling_shape=None if drafter.caps.block_size else sampling_tree_shape(cfg))
    if shape.topk != 1:
        if (cfg.exit_threshold or 0) > 0 or cfg.dynamic_exit or cfg.more_exits:
            raise SpecdraftError("--exit-threshold, --dynamic-exit and --more-exits apply to chains: add --chain")
        return options
    return replace(options, exit_threshold=chain_exit_threshold(drafter, cfg), dynamic_exit=cfg.dynamic_exit,
                   reuse_shallow=cfg.shallow_reuse)


STOP_POLICIES = ("svip", "ddd")
"""The policies that stop drafting by a rule of their own: on a chain, in place of the draft's own η."""


def chain_exit_threshold(drafter, cfg: RuntimeConfig) -> float:
    """A chain's η: runtime.exit_threshold, else the draft's own, except under a policy that stops the chain by its
    own rule (then off)."""
    if cfg.exit_threshold is not None:
        return cfg.exit_threshold
    return 0.0 if cfg.policy in STOP_POLICIES else drafter.caps.exit_threshold


def drafting_policy(cfg: PolicySettings, tokenizer=None) -> Optional[DraftingPolicy]:
    """runtime.policy as the engine's drafting policy (decoding/policies/; None for fixed)."""
    if cfg.policy == "sam":
        corpus = corpus_automaton(corpus_documents(cfg.sam_corpus, tokenizer)) if cfg.sam_corpus else None
        return SamPolicy(Retrieval(cfg.sam_draft, cfg.sam_min_match, corpus), cfg.sam_merge)
    if cfg.policy == "adaptive":
        return AdaptivePolicy(cfg.adaptive_min_depth, cfg.adaptive_step_cost)
    if cfg.policy == "svip":
        return svip_policy(cfg.svip_threshold)
    if cfg.policy == "ddd":
        return ddd_policy(cfg.ddd_threshold)
    return None


def corpus_documents(path: str, tokenizer) -> List[List[int]]:
    """A text file's documents (apart by blank lines), each as token ids without special tokens."""
    if tokenizer is None:
        raise SpecdraftError("runtime.sam_corpus needs the target's tokenizer")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise SpecdraftError(f"runtime.sam_corpus {path}: {err.strerror}") from None
    documents = [part.strip() for part in text.split("\n\n") if part.strip()]
    return [tokenizer(document, add_special_tokens=False)["input_ids"] for document in documents]


def _tree_scorer(drafter, cfg: PruneSettings, chain: bool = False):
    """The draft's tree scorer, or None; its threshold from runtime.prune_threshold when given, else the scorer's
    own (for a chain, its `chain_threshold`)."""
    if not drafter.caps.scores_tree:
        if cfg.prune_threshold is not None:
            raise SpecdraftError("runtime.prune_threshold (--prune-threshold) needs a draft that scores its tree "
                                 "(a C2T export); this one does not")
        return None
    scorer = drafter.tree_scorer()
    if cfg.prune_threshold is not None:
        scorer.threshold = cfg.prune_threshold
    elif chain:
        scorer.threshold = scorer.chain_threshold
    return scorer


def _judge(drafter, cfg: PruneSettings):
    """The draft's judge at runtime.judge_threshold δ, or None (exact acceptance, the default)."""
    if cfg.judge_threshold is None:
        return None
    if not drafter.caps.judges:
        raise SpecdraftError("runtime.judge_threshold (--judge-threshold) needs a draft that ships a judge "
                             "(a Judge export); this one does not")
    judge = drafter.node_judge()
    judge.threshold = cfg.judge_threshold
    return judge


def set_judge_threshold(runtime: Runtime, threshold: Optional[float]) -> None:
    """Judge the runtime's cycles at δ = `threshold` from now on (its draft must ship a judge), or accept exactly
    with None."""
    settings = replace(runtime.settings, judge_threshold=threshold)
    runtime.engine.use_judge(_judge(runtime.engine.drafter, settings))
    runtime.settings = settings


def _drafter(loaded: LoadedDraft, target: LoadedTarget, target_model: VerifierModel):
    draft = loaded.draft.to(device=target_model.device, dtype=target.model.dtype)
    return loaded.spec.runtime(draft, loaded.method_cfg, target_model)


def _runtime_drafter(loaded: Optional[LoadedDraft], target: LoadedTarget, target_model: VerifierModel,
                     cfg: RuntimeConfig, max_len: int):
    """The drafter: runtime.draft_model's small model when set (runtime/draft_model.py), else the trained draft's."""
    if cfg.draft_model is not None:
        return load_draft_model(cfg.draft_model, target, target_model, max_len, cfg.dtype)
    if loaded is None:
        raise SpecdraftError("no draft to run: give an export (or a training run directory), or --draft-model SMALL "
                             "(runtime.draft_model) beside --target")
    return _drafter(loaded, target, target_model)


def _exit_choice(drafter, cfg: ExitSettings, target: LoadedTarget, target_model: VerifierModel) -> ExitChoice:
    """The first draft and those of `cfg.more_exits`, which must run the target's shallow layers."""
    if not cfg.dynamic_exit:
        raise SpecdraftError("--more-exits needs --dynamic-exit (it chooses the exit per cycle)")
    drafters = [drafter]
    for path in cfg.more_exits:
        loaded = load_draft(Path(path))
        _check_geometry(loaded, target)
        drafters.append(_drafter(loaded, target, target_model))
    return ExitChoice(drafters)


def load_parts(path: Optional[str | Path], cfg: RuntimeConfig = RuntimeConfig(), target_path: Optional[str] = None,
               trust_remote_code: bool = False) -> Tuple[Optional[LoadedDraft], LoadedTarget]:
    """An export or run directory -> (the draft, the target it was trained for or `target_path`, its weights as
    `runtime_target` says), checked to fit; `path` None: (None, `target_path` alone), for runtime.draft_model to
    draft for. `trust_remote_code`: the caller's own consent to run the target's code (never read from a file)."""
    if path is None:
        return None, _target_alone(target_path, cfg, trust_remote_code)
    loaded = load_draft(path, target_path=target_path, trust_remote_code=trust_remote_code)
    target_cfg = replace(runtime_target(loaded.target_config, cfg), **({"path": target_path} if target_path else {}))
    target_cfg = with_remote_code(target_cfg, trust_remote_code, f"the draft {path}")
    target = load_target(target_cfg, device=resolve_device(cfg.device), dtype=cfg.dtype, require_chat_template=False)
    _check_geometry(loaded, target)
    return loaded, target


def load_draft_for(path: str | Path, target: LoadedTarget, trust_remote_code: bool = False) -> LoadedDraft:
    """An export or run directory -> its draft, checked to fit `target` (one loaded target benched with several
    methods' drafts)."""
    loaded = load_draft(path, target_path=target.info.name_or_path, trust_remote_code=trust_remote_code)
    _check_geometry(loaded, target)
    return loaded


def _target_alone(target_path: Optional[str], cfg: RuntimeConfig, trust_remote_code: bool) -> LoadedTarget:
    """The target of a runtime without a trained draft (`--target` beside `--draft-model`)."""
    if target_path is None or cfg.draft_model is None:
        raise SpecdraftError("without a draft directory the runtime needs --target TARGET (hub id, directory, GGUF or "
                             "pkg:MODEL) and --draft-model SMALL (a small model of its tokenizer that drafts for it)")
    target_cfg = with_remote_code(runtime_target(TargetConfig(path=target_path), cfg), trust_remote_code,
                                  f"--target {target_path}")
    return load_target(target_cfg, device=resolve_device(cfg.device), dtype=cfg.dtype, require_chat_template=False)


def build_runtime(loaded: Optional[LoadedDraft], target: LoadedTarget,
                  cfg: RuntimeConfig = RuntimeConfig()) -> Runtime:
    """A ready SpecEngine over loaded parts (`loaded` None: runtime.draft_model drafts). It copies the target's
    weights, so one loaded target serves several runtimes (one per tree shape, say) without loading it again."""
    max_len = min(cfg.max_len, target.info.max_position_embeddings)
    target_model: VerifierModel = from_hf(target.model, target.info)
    drafter = _runtime_drafter(loaded, target, target_model, cfg, max_len)
    shape = tree_shape(cfg, drafter.caps.block_size)
    if cfg.more_exits:
        drafter = _exit_choice(drafter, cfg, target, target_model)
    options = engine_options(drafter, shape, cfg, target.tokenizer, _intermediate(cfg, target, target_model, max_len))
    engine = SpecEngine(target_model, drafter, shape, max_len, hf_rope_tables(target.model, max_len),
                        None if cfg.cuda_graphs else False, options)
    return Runtime(engine=engine, target=target, draft=loaded, eos_ids=eos_token_ids(target.model, target.tokenizer),
                   settings=cfg)


def load_runtime(path: Optional[str | Path], cfg: RuntimeConfig = RuntimeConfig(), target_path: Optional[str] = None,
                 trust_remote_code: bool = False) -> Runtime:
    """An export or run directory -> a ready SpecEngine over the target it was trained for (or `target_path`);
    `path` None: `target_path` alone, runtime.draft_model drafting."""
    return build_runtime(*load_parts(path, cfg, target_path, trust_remote_code), cfg)
