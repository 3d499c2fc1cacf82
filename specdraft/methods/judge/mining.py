"""The judge's data stage (`specdraft distill-data`): labels mined from prompts whose answers a program checks,
as AutoJudge does (Garipov et al., arXiv:2504.20039), and labels a user supplies.

Mined: the target answers a shard's prompts greedily, all at once (`Greedy`: the static batched engine on a GPU,
else Hugging Face `generate`). A prompt without a check, or whose answer fails its check, is skipped (the suite
keeps the items the target solves); a check that fails itself (a crash, a time-out) makes the prompt an error.
On each solved prompt the base draft drafts for the target (speculative decoding at T=0, exact acceptance, the
runtime's default tree, traced: one prompt at a time, so only on those). At every mismatch (a cycle whose draft's
own next token, the most probable child of the last accepted node, is not the target's), the run branches: the
draft's token is accepted, the target continues greedily from it, and the check labels the mismatch 1 if the
answer is still correct, 0 if not. A branch whose check fails itself labels nothing and is counted
(`check_errors`), never as a positive. Each label keeps the target's last-layer state before the final norm at
the drafted token, what the judge reads at run time; the states come from the branch's own first forward
(`Greedy`, `branch_batch_size` branches at a time).

On-policy (`method.mine_judge`, on_policy.py): the base runs accept by a judge at `method.mine_threshold`, so their
answers may hold judge-accepted tokens (and need not pass their check). Every position where the draft's own next
token is not the target's is a mismatch, the judge-accepted ones included, and gets two branches: the candidate (the
draft's token) and the control (the target's own token), both continued greedily. The control's answer failing its
check labels nothing (the state was lost before: `unrecoverable`); else the candidate's verdict is the label.

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
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np
import torch

from specdraft.core.errors import SpecdraftError
from specdraft.data.checks import Check, check_of, verdict
from specdraft.data.sources import source_records
from specdraft.decoding.batched import BatchedGenerator, batched_generator, unsupported_reason
from specdraft.decoding.engine import SpecEngine
from specdraft.decoding.outputs import GenerationResult
from specdraft.decoding.verifier import from_hf, hf_rope_tables
from specdraft.decoding.tree import TreeShape
from specdraft.methods.judge.config import JudgeConfig
from specdraft.methods.judge.on_policy import judge_accepted, mining_judge
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
                     "unrecoverable": Value("int32"), "cycles": Value("int32"), "answer_tokens": Value("int32")})


RECORDS_SCHEMA = 2
"""The shards' columns' version (2: `unrecoverable`), in the fingerprint: resuming over older shards is refused."""


def records_fingerprint(cfg: JudgeConfig) -> Dict[str, Any]:
    """The settings that make two runs' labels interchangeable (besides the prompts and the target)."""
    values: Dict[str, Any] = {"draft": cfg.draft, "schema": RECORDS_SCHEMA}
    if cfg.mine_judge is not None:
        values.update(mine_judge=cfg.mine_judge, mine_threshold=cfg.mine_threshold)
    return values


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
    control: Optional["Branch"] = None
    """On-policy mining: the target's own token at the position instead; the label stands only where its answer
    passes the check."""

    @property
    def unrecoverable(self) -> bool:
        """The control's answer fails its check: no label."""
        return self.control is not None and self.control.label == 0


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


class Greedy:
    """The target's greedy continuations of many prompts, with its state at each prompt's last token (the last
    layer's output before the final norm): the static batched engine (specdraft.decoding.batched: a static KV cache,
    CUDA graphs, continuous batching) where `static` is given, else Hugging Face `generate`, `batch_size` prompts
    of similar length at a time."""

    def __init__(self, target, eos_ids: List[int], batch_size: int, static: Optional[BatchedGenerator] = None):
        self.target, self.eos_ids, self.batch_size, self.static = target, eos_ids, batch_size, static

    def continuations(self, prompts: List[List[int]], max_new_tokens: int) -> Tuple[List[List[int]], torch.Tensor]:
        """-> each prompt's continuation (cut before EOS, at most max_new_tokens), states [P, H] float16 (CPU)."""
        if not prompts:
            return [], torch.zeros(0, self.target.info.hidden_size, dtype=torch.float16)
        if self.static is not None:
            states: Dict[int, torch.Tensor] = {}
            continued = self.static.generate(prompts, max_new_tokens, self.eos_ids, last_states=states)
            return continued, _half(torch.stack([states[i] for i in range(len(prompts))]))
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        continued, last = [[] for _ in prompts], [None] * len(prompts)
        for start in range(0, len(order), self.batch_size):
            chunk = order[start:start + self.batch_size]
            with first_final_states(self.target.model) as kept:
                tokens = greedy_continuations(self.target.model, [prompts[i] for i in chunk], max_new_tokens,
                                              self.eos_ids, self.target.tokenizer.pad_token_id)
            for i, answer, state in zip(chunk, tokens, _half(kept[0][:, -1])):  # left padding: the end
                continued[i], last[i] = answer, state
        return continued, torch.stack(last)


def _half(states: torch.Tensor) -> torch.Tensor:
    """[N, H] -> float16 on the CPU, clamped to its range (what the records store)."""
    return states.float().clamp(-FLOAT16_MAX, FLOAT16_MAX).half().cpu()


def static_generator(target, engine: str, batch_size: int, max_len: int, device: str) -> Optional[BatchedGenerator]:
    """The static batched engine where `engine` (distill.engine) picks it: static, or auto on a GPU for a target
    it reproduces; None for Hugging Face `generate`."""
    if engine == "hf":
        return None
    reason = unsupported_reason(target.model, target.info, max_len)
    if engine == "static" and reason:
        raise SpecdraftError(f"distill.engine=static cannot run target {target.info.name_or_path}: {reason}; "
                             f"use distill.engine=hf or auto")
    if reason or (engine == "auto" and torch.device(device).type != "cuda"):
        return None
    return batched_generator(target.model, target.info, batch_size)


def continue_branches(greedy: Greedy, branches: List[Branch]) -> None:
    """Each branch's greedy continuation (up to its room) and the target's final state at its drafted token."""
    room = max([1, *(branch.room for branch in branches)])
    continued, states = greedy.continuations([branch.prefix for branch in branches], room)
    for branch, tokens, state in zip(branches, continued, states):
        branch.continuation, branch.hidden = tokens[:max(0, branch.room)], state


class JudgeMiner:
    """RecordStage maker: {position: Conversation} of a shard -> (one row per labelled prompt, problems)."""

    def __init__(self, cfg, ctx):
        self.cfg, self.ctx = cfg, ctx
        self.target = ctx.target
        self.eos_ids = eos_token_ids(ctx.target.model, ctx.target.tokenizer)
        self.engine = self._engine()
        static = static_generator(ctx.target, ctx.distill.engine, cfg.branch_batch_size,
                                  ctx.data.max_length + ctx.distill.max_new_tokens + 1, ctx.device)
        self.greedy = Greedy(ctx.target, self.eos_ids, cfg.branch_batch_size, static)
        self._records: Dict[str, list] = {}

    def _engine(self) -> SpecEngine:
        """The base draft drafting for the target, as `specdraft.runtime.load.build_runtime` builds it: exact
        acceptance, or method.mine_judge's (on-policy mining)."""
        info, shape = self.target.info, TreeShape()
        room = shape.budget + shape.scratch + shape.depth + 2  # the last cycle's tree and scratch
        max_len = min(self.ctx.data.max_length + self.ctx.distill.max_new_tokens + room, info.max_position_embeddings)
        target_model = from_hf(self.target.model, info)
        judge = mining_judge(self.cfg, self.ctx.guide, self.ctx.base, target_model.device)
        return SpecEngine(target_model, self.ctx.base.runtime(target_model), shape, max_len,
                          hf_rope_tables(self.target.model, max_len), judge=judge,
                          trace_target_choices=judge is not None)

    def record_of(self, conversation) -> dict:
        if conversation.source not in self._records:
            self._records[conversation.source] = list(source_records(conversation.source))
        return self._records[conversation.source][conversation.index]

    def prompt_ids(self, conversation) -> List[int]:
        """The conversation's first user turn (after its system prompt, if any), chat template (or
        target.prompt_format's plain form) applied."""
        messages = conversation.messages
        first_user = next(i for i, message in enumerate(messages) if message["role"] == "user")
        return self.target.chat.ids(messages[:first_user + 1], add_generation_prompt=True)

    def records(self, conversations) -> Tuple[List[dict], List[dict]]:
        problems, prompts, checked = [], [], []
        for conversation in conversations.values():
            try:
                prompt = self._prompt(conversation)
            except _Unlabelled as unlabelled:
                self._problem(problems, conversation, unlabelled)
                continue
            if isinstance(prompt, Check):
                checked.append((conversation, prompt))
            else:
                prompts.append(prompt)
        for conversation, check, answer in self._solved(checked, problems):
            try:
                prompts.append(self._mined(conversation, check, answer))
            except _Unlabelled as unlabelled:
                self._problem(problems, conversation, unlabelled)
        branches = [branch for prompt in prompts for branch in prompt.branches]
        continue_branches(self.greedy, branches + [branch.control for branch in branches if branch.control is not None])
        self._label(prompts)
        rows = []
        for prompt in prompts:
            rows.append(_row(prompt))
            self.ctx.progress(1)
        return rows, problems

    def _problem(self, problems: List[dict], conversation, unlabelled: "_Unlabelled") -> None:
        problems.append({"source": conversation.source, "index": conversation.index, "status": unlabelled.status,
                         "reason": str(unlabelled)})
        self.ctx.progress(1)

    def _prompt(self, conversation):
        """A supplied prompt's labels (a Prompt), or the Check of a prompt to mine."""
        record = self.record_of(conversation)
        if isinstance(record, dict) and "labels" in record:
            return self._supplied(conversation, record)
        check = check_of(record)
        if check is None:
            raise _Unlabelled("skipped", "the prompt has no answer check (specdraft.data.checks)")
        return check

    def _solved(self, checked: List[tuple], problems: List[dict]) -> List[tuple]:
        """(conversation, check, greedy answer) of the prompts whose greedy answer, made for all of them at once,
        passes its check: speculative decoding (one prompt at a time) runs on those alone. The rest are skipped (a
        failed answer) or errors (a check that failed itself)."""
        answers, _ = self.greedy.continuations([self.prompt_ids(conversation) for conversation, _ in checked],
                                               self.ctx.distill.max_new_tokens)
        outcomes = self._verdicts([(check, self._text(answer)) for (_, check), answer in zip(checked, answers)])
        solved = []
        for (conversation, check), answer, outcome in zip(checked, answers, outcomes):
            if outcome:
                solved.append((conversation, check, answer))
            else:
                self._problem(problems, conversation, _unsolved(outcome))
        return solved

    def _mined(self, conversation, check: Check, greedy_answer: List[int]) -> Prompt:
        """Speculative decoding with the draft (traced), each mismatch a branch. Under exact acceptance its answer is
        checked again where it differs from the batched greedy one (a near-tied argmax rounded the other way, below
        float32); under a mining judge each branch has its control instead (`_on_policy`)."""
        prompt_ids, budget = self.prompt_ids(conversation), self.ctx.distill.max_new_tokens
        try:
            result = self.engine.generate(prompt_ids, budget, self.eos_ids, trace=True)
        except SpecdraftError as err:
            raise _Unlabelled("skipped", str(err)) from None
        answer = result.tokens
        if self.engine.judge is not None:
            return Prompt(conversation.source, conversation.index, "mined", self._on_policy(prompt_ids, result),
                          check, len(result.accepted), len(answer))
        if answer != greedy_answer:
            solved = verdict(check, self._text(answer), self.cfg.check_timeout_s)
            if not solved:
                raise _unsolved(solved)
        branches = [self._branch(prompt_ids, answer[:t], token, answer[t]) for t, token in mismatches(result)]
        return Prompt(conversation.source, conversation.index, "mined", branches, check, len(result.accepted),
                      len(answer))

    def _branch(self, prompt_ids: List[int], before: List[int], token: int, target_token: int) -> Branch:
        """The branch that takes `token` after the answer so far (`before`), with the room the budget leaves."""
        room = self.ctx.distill.max_new_tokens - len(before) - 1 if token not in self.eos_ids else 0
        return Branch(prefix=prompt_ids + before + [token], answer=before + [token], room=room, position=len(before),
                      draft_token=token, target_token=target_token)

    def _on_policy(self, prompt_ids: List[int], result: GenerationResult) -> List[Branch]:
        """Every mismatch of a judged run, the judge's accepted ones and those it refused (on_policy.py): the
        candidate branch (the draft's token), its control the target's own token."""
        answer = result.tokens
        found = judge_accepted(result) + [(t, token, answer[t]) for t, token in mismatches(result)]
        branches = []
        for t, token, own in sorted(found):
            branch = self._branch(prompt_ids, answer[:t], token, own)
            branch.control = self._branch(prompt_ids, answer[:t], own, own)
            branches.append(branch)
        return branches

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

    def _verdicts(self, jobs: List[Tuple[Check, str]]) -> List[Optional[bool]]:
        """Each (check, answer text)'s verdict, None where the check failed itself (checks run on a few threads:
        code checks wait on their subprocess)."""
        timeout = self.cfg.check_timeout_s
        with ThreadPoolExecutor(CHECK_THREADS) as pool:
            return list(pool.map(lambda job: verdict(job[0], job[1], timeout), jobs))

    def _label(self, prompts: List[Prompt]) -> None:
        """Each mined branch's verdict on its answer: the drafted token, then the target's greedy continuation;
        with a control, the label stands only where the control's answer passes (a failed one: unrecoverable)."""
        mined = [(prompt.check, branch) for prompt in prompts if prompt.check is not None for branch in prompt.branches]
        checked = mined + [(check, branch.control) for check, branch in mined if branch.control is not None]
        outcomes = self._verdicts([(check, self._text(branch.answer + branch.continuation))
                                   for check, branch in checked])
        for (_, branch), outcome in zip(checked, outcomes):
            branch.label = None if outcome is None else int(outcome)
        for _, branch in mined:
            if branch.control is not None and branch.control.label != 1:
                branch.label = None


def _unsolved(outcome: Optional[bool]) -> "_Unlabelled":
    """Why the target's own answer labels nothing: it fails its check, or the check failed itself."""
    if outcome is None:
        return _Unlabelled("error", "the check of the target's own answer failed (a crash or a time-out)")
    return _Unlabelled("skipped", "the target's own answer fails its check")


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
    unrecoverable = sum(branch.unrecoverable for branch in prompt.branches)
    hidden = torch.stack([b.hidden for b in labelled]).flatten().numpy() if labelled else np.zeros(0, np.float16)
    return {"source": prompt.source, "index": prompt.index, "origin": prompt.origin,
            "labels": [b.label for b in labelled], "hidden": hidden,
            "positions": [b.position for b in labelled], "draft_tokens": [b.draft_token for b in labelled],
            "target_tokens": [b.target_token for b in labelled],
            "check_errors": len(prompt.branches) - len(labelled) - unrecoverable, "unrecoverable": unrecoverable,
            "cycles": prompt.cycles, "answer_tokens": prompt.answer_tokens}
