"""C2T's data stage (MethodSpec.records): traces of the runtime's own tree drafting, labelled by the target.

For each prompt (its first user turn, chat-templated) the runtime's engine decodes greedily with the base draft over
a tree of `method.trace_depth` x `method.trace_topk` whose verified nodes are the whole expansion (no rerank, the
paper's) or, with `method.trace_budget`, the budget's best by joint probability (the runtime's selection). A
recording tree scorer keeps every candidate and records what the runtime's scorer would be given (COLUMNS); the
verify pass labels each verified candidate accepted or not (on the target's greedy path). Per traced tree all
accepted candidates are kept and `negatives_per_positive` times as many verified, rejected ones at random (at least
one), so that the classes stay about balanced. One record row per prompt, the kept candidates in list columns, with
the draft it was recorded over (its path and a digest of its weights: training refuses rows of another draft).
"""
from __future__ import annotations

from typing import Any, Dict, List, Tuple

import torch

from specdraft.core.errors import SpecdraftError
from specdraft.decoding.engine import SpecEngine
from specdraft.decoding.verifier import from_hf, hf_rope_tables
from specdraft.decoding.tree import TreeShape
from specdraft.kernels.prune_children import child_inputs
from specdraft.methods.base import RecordContext
from specdraft.methods.c2t.config import C2TConfig
from specdraft.methods.c2t.model import ENTROPY_TOP, draft_digest
from specdraft.targets.chat import TextChat
from specdraft.targets.load import eos_token_ids


COLUMNS = ("joint_logprob", "entropy", "depth", "logprob", "rank")
"""What a trace row records of each kept candidate (a list column each, beside its label): its joint
log-probability, its parent's top-M entropy, its depth (1-based), its own draft log-probability and its rank among
its parent's children as drafted: every feature either feature set (method.features) reads."""


def trace_features():
    """The `datasets.Features` of a trace row."""
    from datasets import Features, Sequence, Value

    return Features({
        "source": Value("string"), "index": Value("int64"), "draft": Value("string"),
        "draft_digest": Value("string"), "cycles": Value("int64"), "accepted": Value("int64"),
        "candidates": Value("int64"), "joint_logprob": Sequence(Value("float32")),
        "entropy": Sequence(Value("float32")), "depth": Sequence(Value("int32")),
        "logprob": Sequence(Value("float32")), "rank": Sequence(Value("int32")), "label": Sequence(Value("int8"))})


def trace_fingerprint(cfg: C2TConfig) -> Dict[str, Any]:
    """The settings that make two runs' traces interchangeable (besides the prompts and the target)."""
    return {"draft": cfg.draft, "trace_depth": cfg.trace_depth, "trace_topk": cfg.trace_topk,
            "trace_budget": cfg.trace_budget, "negatives_per_positive": cfg.negatives_per_positive,
            "columns": list(COLUMNS)}


def trace_shape(cfg: C2TConfig) -> TreeShape:
    """The traced trees: trace_depth x trace_topk, the whole expansion verified or trace_budget nodes of it."""
    shape = TreeShape(cfg.trace_depth, cfg.trace_topk, 2)
    return TreeShape(shape.depth, shape.topk, cfg.trace_budget or shape.num_candidates).validated()


class TraceRecorder:
    """A TreeScorer that keeps every candidate and records what the runtime's scorer computes of each (its joint
    log-probability, its parent's entropy: `kernels.prune_children.child_inputs`, the same numbers; its depth, own
    log-probability and rank), one call per depth."""

    threshold = 0.0
    chain_threshold = 0.0

    def __init__(self):
        self.calls: List[Dict[str, torch.Tensor]] = []

    def prune(self, child_logprobs: torch.Tensor, parent_scores: torch.Tensor, parent_logits: torch.Tensor,
              depth: int) -> torch.Tensor:
        joint, entropy = child_inputs(child_logprobs, parent_scores, parent_logits, ENTROPY_TOP)  # [p, k], [p]
        ranks = torch.arange(joint.shape[1], dtype=torch.int32, device=joint.device)[None, :].expand_as(joint)
        self.calls.append({"joint_logprob": joint.flatten(), "entropy": entropy[:, None].expand_as(joint).flatten(),
                           "depth": torch.full((joint.numel(),), depth, dtype=torch.int32, device=joint.device),
                           "logprob": child_logprobs.float().flatten(), "rank": ranks.flatten()})
        return child_logprobs

    def take(self) -> Dict[str, torch.Tensor]:
        """The recorded calls since the last take, joined -> {column of COLUMNS: [C - 1]}: one entry per candidate
        after the root, in candidate order (the order the expansion numbers them)."""
        columns = {name: torch.cat([call[name] for call in self.calls]) for name in COLUMNS}
        self.calls = []
        return columns


def _prompt_ids(chat: TextChat, conversation) -> List[int]:
    """The first user turn, chat template (or target.prompt_format's plain form) applied."""
    first_user = next(message for message in conversation.messages if message["role"] == "user")
    return chat.ids([first_user], add_generation_prompt=True)


class TraceMaker:
    """RecordStage.maker: loaded once per run (the engine over the target and the base draft)."""

    def __init__(self, cfg: C2TConfig, ctx: RecordContext):
        if ctx.base is None:
            raise SpecdraftError("C2T records traces of a trained draft: method.draft names none")
        self.cfg, self.ctx = cfg, ctx
        self.digest = draft_digest(ctx.base.draft)  # before the runtime moves the draft to the target's device
        self.recorder = TraceRecorder()
        self.engine = self._engine()
        self.eos_ids = set(eos_token_ids(ctx.target.model, ctx.target.tokenizer))

    def _engine(self) -> SpecEngine:
        target, shape = self.ctx.target, trace_shape(self.cfg)
        room = self.ctx.data.max_length + self.ctx.distill.max_new_tokens + shape.depth + 2 + shape.budget
        max_len = min(room + shape.scratch, target.info.max_position_embeddings)
        target_model = from_hf(target.model, target.info)
        return SpecEngine(target_model, self.ctx.base.runtime(target_model), shape, max_len,
                          hf_rope_tables(target.model, max_len), use_graphs=False, tree_scorer=self.recorder)

    def records(self, conversations: Dict[int, Any]) -> Tuple[List[dict], List[dict]]:
        rows, problems = [], []
        for conversation in conversations.values():
            try:
                rows.append(self._row(conversation))
            except SpecdraftError as err:
                problems.append({"source": conversation.source, "index": conversation.index, "status": "error",
                                 "reason": str(err)})
            self.ctx.progress(1)
        return rows, problems

    @torch.no_grad()
    def _row(self, conversation) -> dict:
        prompt = _prompt_ids(self.ctx.target.chat, conversation)
        trees = self._trace(prompt)
        kept = [self._kept(*tree) for tree in trees]
        joined = {name: torch.cat([part[name] for part in kept]).tolist() if kept else []
                  for name in (*COLUMNS, "label")}
        return {"source": conversation.source, "index": conversation.index, "draft": str(self.ctx.base.source),
                "draft_digest": self.digest, "cycles": len(trees), "accepted": sum(int(t[1].sum()) for t in trees),
                "candidates": sum(int(t[2].sum()) for t in trees), **joined}

    def _trace(self, prompt: List[int]) -> List[Tuple[Dict[str, torch.Tensor], torch.Tensor, torch.Tensor]]:
        """Greedy decoding of `prompt` with traced trees -> per cycle ({column: [C - 1]}, accepted, verified [C - 1]
        bool), on the host."""
        engine, max_new = self.engine, self.ctx.distill.max_new_tokens
        if len(prompt) + max_new + engine.shape.budget + engine.shape.scratch > engine.max_len:
            raise SpecdraftError(f"prompt of {len(prompt)} tokens + {max_new} new tokens + a traced tree of "
                                 f"{engine.shape.budget} nodes do not fit the target's {engine.max_len} positions")
        generated = [engine.prefill(torch.tensor(prompt, device=engine.device), 0.0)]
        acceptance, trees = engine.acceptance(0.0), []
        while len(generated) < max_new and generated[-1] not in self.eos_ids:
            tree = engine.build_tree()
            columns = self.recorder.take()
            out = engine.accept_and_commit(acceptance, tree, engine.verify_forward(tree))
            accepted_nodes = out.accepted_nodes[out.accepted_nodes > 0]  # the drafted nodes the target accepted
            accepted = torch.zeros(len(columns["depth"]), dtype=torch.bool, device=engine.device)
            accepted[tree.candidate_ids[accepted_nodes] - 1] = True  # candidate c is entry c - 1 (after the root)
            verified = torch.zeros_like(accepted)
            drafted = tree.candidate_ids[tree.valid & (tree.candidate_ids > 0)]  # the verified nodes but the root
            verified[drafted - 1] = True
            trees.append(({name: column.cpu() for name, column in columns.items()}, accepted.cpu(), verified.cpu()))
            count, *emitted = out.for_host.tolist()
            new_tokens = emitted[:count]
            eos = next((i for i, token in enumerate(new_tokens) if token in self.eos_ids), None)
            generated += new_tokens if eos is None else new_tokens[:eos + 1]
        return trees

    def _kept(self, columns: Dict[str, torch.Tensor], accepted: torch.Tensor,
              verified: torch.Tensor) -> Dict[str, torch.Tensor]:
        """One traced tree's accepted candidates and a random draw of its verified, rejected ones -> their columns
        and labels."""
        positives = accepted.nonzero()[:, 0]
        negatives = (verified & ~accepted).nonzero()[:, 0]
        wanted = max(1, round(self.cfg.negatives_per_positive * positives.numel()))
        negatives = negatives[torch.randperm(negatives.numel())[:wanted]]
        chosen = torch.cat([positives, negatives])
        return {**{name: column[chosen] for name, column in columns.items()}, "label": accepted[chosen].to(torch.int8)}
