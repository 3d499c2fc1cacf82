"""Build a runtime from a trained draft (an export or a run directory), its target and the runtime settings
(`specdraft.config.RuntimeConfig`: an export carries its recipe's, the CLI overrides them field by field).

Code from elsewhere never runs because a file asked for it: the target loads with `trust_remote_code` only when
the caller passes it (the CLI's `--trust-remote-code`), never from an export's or a checkpoint's settings.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import List, Optional, Tuple

import torch

from specdraft.config import RuntimeConfig
from specdraft.core.errors import SpecdraftError
from specdraft.drafts import LoadedDraft, load_draft
from specdraft.decoding.depth_stop import DepthStop
from specdraft.decoding.dynamic_exit import ExitChoice
from specdraft.decoding.engine import SpecEngine
from specdraft.decoding.retrieval import Retrieval, corpus_automaton
from specdraft.decoding.retrieval_cycles import RetrievalDrafts
from specdraft.decoding.stop_rules import EntropyStop, MassStop
from specdraft.decoding.target import TargetModel, from_hf, hf_rope_tables
from specdraft.decoding.tree import CHAIN_DEPTH, TreeShape
from specdraft.targets import load_target
from specdraft.targets.load import LoadedTarget, eos_token_ids
from specdraft.targets.remote_code import with_remote_code


@dataclass
class Runtime:
    engine: SpecEngine
    target: LoadedTarget  # the Hugging Face model and tokenizer (the `generate` baseline)
    draft: LoadedDraft
    eos_ids: List[int]
    settings: RuntimeConfig

    def encode_chat(self, text: str) -> List[int]:
        tokenizer = self.target.tokenizer
        if tokenizer.chat_template:
            encoded = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                    add_generation_prompt=True, return_dict=True)
            return list(encoded["input_ids"])
        return tokenizer(text)["input_ids"]


GEOMETRY = ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim")  # what a draft fits


def _check_geometry(loaded: LoadedDraft, target: LoadedTarget) -> None:
    trained, given = loaded.target, target.info
    for field_name in GEOMETRY:
        if getattr(trained, field_name) != getattr(given, field_name):
            raise SpecdraftError(f"the draft was trained for a target with {field_name}={getattr(trained, field_name)}"
                                 f" ({trained.name_or_path}); {given.name_or_path} has "
                                 f"{field_name}={getattr(given, field_name)}")


def resolve_device(device: str) -> torch.device:
    return torch.device(("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device)


def tree_shape(cfg: RuntimeConfig) -> TreeShape:
    """The draft's shape: a chain of `depth` (default CHAIN_DEPTH) or a tree (depth, topk, budget), checked."""
    if cfg.chain or cfg.topk == 1:
        return TreeShape.chain(cfg.depth or CHAIN_DEPTH).validated()
    return TreeShape(cfg.depth or TreeShape.depth, cfg.topk, cfg.budget).validated()


def _engine_options(drafter, shape: TreeShape, cfg: RuntimeConfig, tokenizer=None) -> dict:
    """SpecEngine's options from the settings; the chain-only ones are refused on a tree."""
    options = {"reuse_shallow_tree": cfg.shallow_reuse_tree, "overlap": cfg.overlap,
               "tree_scorer": _tree_scorer(drafter, cfg, chain=shape.topk == 1), "judge": _judge(drafter, cfg),
               "sample_drafts": cfg.sample_drafts, **_policy_options(cfg, shape, tokenizer)}
    if shape.topk != 1:
        if (cfg.exit_threshold or 0) > 0 or cfg.dynamic_exit or cfg.more_exits:
            raise SpecdraftError("--exit-threshold, --dynamic-exit and --more-exits apply to chains: add --chain")
        return options
    eta = drafter.caps.exit_threshold if cfg.exit_threshold is None else cfg.exit_threshold
    if "chain_stop" in options and cfg.exit_threshold is None:
        eta = 0.0  # the policy's stop rule replaces the draft's own η
    return {**options, "exit_threshold": eta, "dynamic_exit": cfg.dynamic_exit, "reuse_shallow": cfg.shallow_reuse}


STOP_RULES = {"svip": (EntropyStop, "svip_threshold"), "ddd": (MassStop, "ddd_threshold")}


def _policy_options(cfg: RuntimeConfig, shape: TreeShape, tokenizer=None) -> dict:
    """runtime.policy as SpecEngine options: a drafting policy, or a chain's stop rule (none for fixed)."""
    if cfg.policy == "sam":
        corpus = corpus_automaton(corpus_documents(cfg.sam_corpus, tokenizer)) if cfg.sam_corpus else None
        return {"policy": RetrievalDrafts(Retrieval(cfg.sam_draft, cfg.sam_min_match, corpus), cfg.sam_merge)}
    if cfg.policy in STOP_RULES:
        rule_class, threshold = STOP_RULES[cfg.policy]
        rule = rule_class(getattr(cfg, threshold))
        return {"chain_stop": rule} if shape.topk == 1 else {"policy": DepthStop(rule)}
    return {}


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


def _tree_scorer(drafter, cfg: RuntimeConfig, chain: bool = False):
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


def _judge(drafter, cfg: RuntimeConfig):
    """The draft's judge at runtime.judge_threshold δ, or None (exact acceptance, the default)."""
    if cfg.judge_threshold is None:
        return None
    if not drafter.caps.judges:
        raise SpecdraftError("runtime.judge_threshold (--judge-threshold) needs a draft that ships a judge "
                             "(a Judge export); this one does not")
    judge = drafter.node_judge()
    judge.threshold = cfg.judge_threshold
    return judge


def _drafter(loaded: LoadedDraft, target: LoadedTarget, target_model: TargetModel):
    draft = loaded.draft.to(device=target_model.lm_head_weight.device, dtype=target.model.dtype)
    return loaded.spec.runtime(draft, loaded.method_cfg, target_model)


def _exit_choice(drafter, cfg: RuntimeConfig, target: LoadedTarget, target_model: TargetModel) -> ExitChoice:
    """The first draft and those of `cfg.more_exits`, which must run the target's shallow layers."""
    if not cfg.dynamic_exit:
        raise SpecdraftError("--more-exits needs --dynamic-exit (it chooses the exit per cycle)")
    drafters = [drafter]
    for path in cfg.more_exits:
        loaded = load_draft(Path(path))
        _check_geometry(loaded, target)
        drafters.append(_drafter(loaded, target, target_model))
    return ExitChoice(drafters)


def load_parts(path: str | Path, cfg: RuntimeConfig = RuntimeConfig(), target_path: Optional[str] = None,
               trust_remote_code: bool = False) -> Tuple[LoadedDraft, LoadedTarget]:
    """An export or run directory -> (the draft, the target it was trained for or `target_path`), checked to fit.
    `trust_remote_code`: the caller's own consent to run the target's code (never read from a file)."""
    loaded = load_draft(path, target_path=target_path, trust_remote_code=trust_remote_code)
    target_cfg = replace(loaded.target_config, **({"path": target_path} if target_path else {}))
    target_cfg = with_remote_code(target_cfg, trust_remote_code, f"the draft {path}")
    target = load_target(target_cfg, device=resolve_device(cfg.device), dtype=cfg.dtype, require_chat_template=False)
    _check_geometry(loaded, target)
    return loaded, target


def build_runtime(loaded: LoadedDraft, target: LoadedTarget, cfg: RuntimeConfig = RuntimeConfig()) -> Runtime:
    """A ready SpecEngine over loaded parts. It copies the target's weights, so one loaded target serves several
    runtimes (one per tree shape, say) without loading it again."""
    shape = tree_shape(cfg)
    max_len = min(cfg.max_len, target.info.max_position_embeddings)
    target_model: TargetModel = from_hf(target.model, target.info)
    drafter = _drafter(loaded, target, target_model)
    if cfg.more_exits:
        drafter = _exit_choice(drafter, cfg, target, target_model)
    engine = SpecEngine(target_model, drafter, shape, max_len, hf_rope_tables(target.model, max_len),
                        None if cfg.cuda_graphs else False, **_engine_options(drafter, shape, cfg, target.tokenizer))
    return Runtime(engine=engine, target=target, draft=loaded, eos_ids=eos_token_ids(target.model, target.tokenizer),
                   settings=cfg)


def load_runtime(path: str | Path, cfg: RuntimeConfig = RuntimeConfig(), target_path: Optional[str] = None,
                 trust_remote_code: bool = False) -> Runtime:
    """An export or run directory -> a ready SpecEngine over the target it was trained for (or `target_path`)."""
    return build_runtime(*load_parts(path, cfg, target_path, trust_remote_code), cfg)
