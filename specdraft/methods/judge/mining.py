"""The judge's data stage (`specdraft distill-data`): labels mined from prompts whose answers a program checks,
as AutoJudge does (Garipov et al., arXiv:2504.20039), and labels a user supplies.

Mined: the base draft drafts for the target on each prompt (speculative decoding at T=0, exact acceptance, the
runtime's default tree), which gives the target's own answer. A prompt without a check, or whose answer fails its
check, is skipped (the suite keeps the items the target solves); a check that fails itself (a crash, a time-out)
makes the prompt an error. At every mismatch (a cycle whose draft's own next token, the most probable child of the
last accepted node, is not the target's), the run branches: the draft's token is accepted, the target continues
greedily from it, and the check labels the mismatch 1 if the answer is still correct, 0 if not. A branch whose
check fails itself labels nothing and is counted (`check_errors`), never as a positive. Each label keeps the
target's last-layer state before the final norm at the drafted token, what the judge reads at run time; the
states come from the branch's own first forward (batched, `branch_batch_size` at a time).

Supplied (a prompt record that carries `labels`, in any prompt file of data.prompts):
    {"prompt": "What is 2 + 3?", "labels": [{"prefix": "2 + 3 = ", "candidate": "5", "label": 1},
                                            {"prefix": "The sum is", "candidate_id": 1234, "label": 0}]}
`prefix` is the answer so far (text, tokenized after the chat-templated prompt), `candidate` the drafted token as
text (exactly one token of the target's tokenizer, leading space included) or `candidate_id` its id, `label` 1
when accepting it keeps the answer correct. The state at the candidate is recorded as for mined labels.

One row per prompt, its labels in list-valued columns (`hidden` flattened, float16).
"""
from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np
import torch

from specdraft.core.errors import SpecdraftError
from specdraft.data.checks import Check, check_of, verdict
from specdraft.data.sources import source_records
from specdraft.decoding.engine import GenerationResult, SpecEngine
from specdraft.decoding.target import from_hf, hf_rope_tables
from specdraft.decoding.tree import TreeShape
from specdraft.targets.generate import greedy_continuations
from specdraft.targets.load import eos_token_ids

FLOAT16_MAX = 65504.0
CHECK_THREADS = 8


def record_features():
    """The shards' schema: one row per prompt."""
    from datasets import Features, Sequence, Value

    return Features({"source": Value("string"), "index": Value("int64"), "origin": Value("string"),
                     "labels": Sequence(Value("int8")), "hidden": Sequence(Value("float16")),
                     "positions": Sequence(Value("int32")), "draft_tokens": Sequence(Value("int32")),
                     "target_tokens": Sequence(Value("int32")), "check_errors": Value("int32"),
                     "cycles": Value("int32"), "answer_tokens": Value("int32")})


@dataclass
class Branch:
    """One label to make: the prompt and answer so far, then the drafted token (`prefix` ends with it)."""

    prefix: List[int]
    answer: List[int]
    """The answer up to the drafted token, which it includes."""
    room: int
    """New tokens the branch may add after it."""
    position: int
    draft_token: int
    target_token: int = -1
    label: Optional[int] = None
    """Supplied labels come with it; mined ones from the branch's check."""
    continuation: List[int] = field(default_factory=list)
    hidden: Optional[torch.Tensor] = None


@dataclass
class Prompt:
    """A prompt being labelled."""

    source: str
    index: int
    origin: str
    branches: List[Branch]
    check: Optional[Check] = None
    cycles: int = 0
    answer_tokens: int = 0


def best_child(row: dict, node: int) -> Optional[int]:
    """The child of `node` the draft found most probable in one cycle's trace row, or None (a leaf)."""
    children = [i for i, parent in enumerate(row["parents"])
                if parent == node and row["valid"][i] and row["draft_logprobs"][i] is not None]
    return max(children, key=lambda i: row["draft_logprobs"][i], default=None)


def mismatches(result: GenerationResult) -> List[Tuple[int, int]]:
    """(position in the answer, drafted token) of every cycle that ended where the draft's own next token was not
    the target's, within the answer (`result.tokens`: the prefill's token, then each cycle's)."""
    found, emitted = [], 1
    for row in result.trace:
        accepted = row["accepted_nodes"]
        position = emitted + len(accepted) - 1  # the bonus token's: the target's choice after the accepted ones
        emitted = position + 1
        child = best_child(row, accepted[-1])
        if child is not None and position < len(result.tokens) and row["tokens"][child] != result.tokens[position]:
            found.append((position, row["tokens"][child]))
    return found


@contextlib.contextmanager
def first_final_states(model) -> Iterator[List[torch.Tensor]]:
    """Collects the input of the target's final norm in its first forward (a generate's prefill): [B, T, H]."""
    decoder = model.get_decoder()
    norm = getattr(decoder, "norm", None)
    if norm is None:
        raise SpecdraftError(f"{type(decoder).__name__} has no final `norm`: the judge reads the state before it")
    kept: List[torch.Tensor] = []
    handle = norm.register_forward_pre_hook(lambda module, args: None if kept else kept.append(args[0].detach()))
    try:
        yield kept
    finally:
        handle.remove()


def continue_branches(target, branches: List[Branch], batch_size: int, eos_ids: List[int]) -> None:
    """Each branch's greedy continuation (up to its room) and the target's final state at its drafted token,
    `batch_size` branches of similar length at a time."""
    order = sorted(range(len(branches)), key=lambda i: len(branches[i].prefix))
    for start in range(0, len(order), batch_size):
        chunk = [branches[i] for i in order[start:start + batch_size]]
        room = max(1, max(branch.room for branch in chunk))
        with first_final_states(target.model) as kept:
            continued = greedy_continuations(target.model, [branch.prefix for branch in chunk], room, eos_ids,
                                             target.tokenizer.pad_token_id)
        last = kept[0][:, -1].float().clamp(-FLOAT16_MAX, FLOAT16_MAX).half().cpu()  # [B, H] left padding: the end
        for branch, tokens, state in zip(chunk, continued, last):
            branch.continuation, branch.hidden = tokens[:max(0, branch.room)], state


class JudgeMiner:
    """RecordStage maker: {position: Conversation} of a shard -> (one row per labelled prompt, problems)."""

    def __init__(self, cfg, ctx):
        self.cfg, self.ctx = cfg, ctx
        self.target = ctx.target
        self.eos_ids = eos_token_ids(ctx.target.model, ctx.target.tokenizer)
        self.engine = self._engine()
        self._records: Dict[str, list] = {}

    def _engine(self) -> SpecEngine:
        """The base draft drafting for the target, as `specdraft.runtime.load.build_runtime` builds it."""
        info, shape = self.target.info, TreeShape()
        room = shape.budget + shape.scratch + shape.depth + 2  # the last cycle's tree and scratch
        max_len = min(self.ctx.data.max_length + self.ctx.distill.max_new_tokens + room, info.max_position_embeddings)
        target_model = from_hf(self.target.model, info)
        return SpecEngine(target_model, self.ctx.base.runtime(target_model), shape, max_len,
                          hf_rope_tables(self.target.model, max_len))

    def record_of(self, conversation) -> dict:
        if conversation.source not in self._records:
            self._records[conversation.source] = list(source_records(conversation.source))
        return self._records[conversation.source][conversation.index]

    def prompt_ids(self, conversation) -> List[int]:
        """The conversation's first user turn (after its system prompt, if any), chat template applied."""
        messages = conversation.messages
        first_user = next(i for i, message in enumerate(messages) if message["role"] == "user")
        encoded = self.target.tokenizer.apply_chat_template(messages[:first_user + 1], add_generation_prompt=True,
                                                            return_dict=True)
        return list(encoded["input_ids"])

    def records(self, conversations) -> Tuple[List[dict], List[dict]]:
        problems, prompts = [], []
        for conversation in conversations.values():
            try:
                prompts.append(self._prompt(conversation))
            except _Unlabelled as unlabelled:
                problems.append({"source": conversation.source, "index": conversation.index,
                                 "status": unlabelled.status, "reason": str(unlabelled)})
                self.ctx.progress(1)
        branches = [branch for prompt in prompts for branch in prompt.branches]
        continue_branches(self.target, branches, self.cfg.branch_batch_size, self.eos_ids)
        self._label(prompts)
        rows = []
        for prompt in prompts:
            rows.append(_row(prompt))
            self.ctx.progress(1)
        return rows, problems

    def _prompt(self, conversation) -> Prompt:
        record = self.record_of(conversation)
        if isinstance(record, dict) and "labels" in record:
            return self._supplied(conversation, record)
        check = check_of(record)
        if check is None:
            raise _Unlabelled("skipped", "the prompt has no answer check (specdraft.data.checks)")
        return self._mined(conversation, check)

    def _mined(self, conversation, check: Check) -> Prompt:
        prompt_ids, budget = self.prompt_ids(conversation), self.ctx.distill.max_new_tokens
        try:
            result = self.engine.generate(prompt_ids, budget, self.eos_ids, trace=True)
        except SpecdraftError as err:
            raise _Unlabelled("skipped", str(err)) from None
        solved = verdict(check, self._text(result.tokens), self.cfg.check_timeout_s)
        if solved is None:
            raise _Unlabelled("error", "the check of the target's own answer failed (a crash or a time-out)")
        if not solved:
            raise _Unlabelled("skipped", "the target's own answer fails its check")
        answer = result.tokens
        branches = [Branch(prefix=prompt_ids + answer[:t] + [token], answer=answer[:t] + [token],
                           room=budget - t - 1 if token not in self.eos_ids else 0, position=t, draft_token=token,
                           target_token=answer[t]) for t, token in mismatches(result)]
        return Prompt(conversation.source, conversation.index, "mined", branches, check, len(result.accepted),
                      len(answer))

    def _supplied(self, conversation, record: dict) -> Prompt:
        prompt_ids, tokenizer = self.prompt_ids(conversation), self.target.tokenizer
        branches = []
        for number, item in enumerate(record["labels"]):
            try:
                answer = list(tokenizer(str(item.get("prefix", "")), add_special_tokens=False)["input_ids"])
                token = _candidate_id(tokenizer, item)
                label = int(item["label"])
            except (KeyError, TypeError, ValueError) as err:
                raise _Unlabelled("error", f"label {number}: {err}") from None
            if label not in (0, 1):
                raise _Unlabelled("error", f"label {number}: label must be 0 or 1, got {label}")
            branches.append(Branch(prefix=prompt_ids + answer + [token], answer=answer + [token], room=0,
                                   position=len(answer), draft_token=token, label=label))
        return Prompt(conversation.source, conversation.index, "supplied", branches)

    def _text(self, tokens: List[int]) -> str:
        return self.target.tokenizer.decode(tokens, skip_special_tokens=True)

    def _label(self, prompts: List[Prompt]) -> None:
        """Each mined branch's verdict (checks run on a few threads: code checks wait on their subprocess)."""
        jobs = [(prompt.check, branch) for prompt in prompts if prompt.check is not None for branch in prompt.branches]
        timeout = self.cfg.check_timeout_s

        def judged(job) -> Optional[bool]:
            check, branch = job
            return verdict(check, self._text(branch.answer + branch.continuation), timeout)

        with ThreadPoolExecutor(CHECK_THREADS) as pool:
            outcomes = list(pool.map(judged, jobs))
        for (_, branch), outcome in zip(jobs, outcomes):
            branch.label = None if outcome is None else int(outcome)


class _Unlabelled(Exception):
    """A prompt that yields no row: `status` is skipped or error, the message its reason."""

    def __init__(self, status: str, reason: str):
        super().__init__(reason)
        self.status = status


def _candidate_id(tokenizer, item: dict) -> int:
    if "candidate_id" in item:
        return int(item["candidate_id"])
    ids = tokenizer(str(item["candidate"]), add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise ValueError(f"candidate {item['candidate']!r} is {len(ids)} tokens, not one; give candidate_id")
    return int(ids[0])


def _row(prompt: Prompt) -> dict:
    labelled = [branch for branch in prompt.branches if branch.label is not None]
    hidden = torch.stack([b.hidden for b in labelled]).flatten().numpy() if labelled else np.zeros(0, np.float16)
    return {"source": prompt.source, "index": prompt.index, "origin": prompt.origin,
            "labels": [b.label for b in labelled], "hidden": hidden,
            "positions": [b.position for b in labelled], "draft_tokens": [b.draft_token for b in labelled],
            "target_tokens": [b.target_token for b in labelled],
            "check_errors": len(prompt.branches) - len(labelled), "cycles": prompt.cycles,
            "answer_tokens": prompt.answer_tokens}
