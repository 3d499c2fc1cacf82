"""Hierarchical drafting (SpecMQuant, arXiv:2505.22179): a small model between the drafter and the target.

On a target whose verify costs more with every row (a weight-only quantized one, whose kernels dequantize per row
block), a tree of 40 nodes costs far more than a decode step. Here a small model (`IntermediateModel`, core/
drafting.py) runs the drafted tree instead, and the engine keeps the path it would accept greedily (the deepest
path of its own argmax tokens, `kernels.tree_verify`) plus its own next token after that path: a sequence of at
most depth + 1 drafted tokens. The target verifies that sequence as a chain of depth + 1 rows, and its greedy
acceptance decides the output: lossless against the target whatever the small model chose. Static shapes: the
chain always has depth + 1 rows, those past the kept sequence are padding (no parent: never accepted).

The cycle context (cycles/context.py) calls the stage from `build_tree` (so that a cycle, its phases and their
graphs see one tree, the chain) and from `commit` (the small model's cache follows the confirmed tokens). Greedy only
(T = 0).

`CompactIntermediate` is a separate small model of the target's tokenizer (a VerifierModel with its own KV
cache). Its cache lags one token: the last confirmed token of a cycle may be the small model's own next token,
which no pass of it has run yet, so each pass runs that token first, at slot prefix - 1 (rewriting what is there),
then the tree.
"""
from __future__ import annotations

from typing import Dict, List, Optional

import torch

from specdraft.core.drafting import IntermediateModel
from specdraft.core.errors import SpecdraftError
from specdraft.kernels.kv_compact import compact_kv
from specdraft.kernels.tree_verify import verify_greedy
from specdraft.decoding.verifier import VerifierModel
from specdraft.decoding.tree import DraftTree


class HierarchicalStage:
    """The engine's second stage: `narrow` a drafted tree to the chain the target verifies, `commit` the cycle's
    confirmed rows to the small model. `depth`: the tree's depth (the chain has depth + 1 rows, root included)."""

    def __init__(self, model: IntermediateModel, depth: int, max_len: int, device: torch.device,
                 dtype: torch.dtype):
        self.model, self.depth = model, depth
        model.allocate(max_len, device, dtype)
        self.rows = torch.arange(depth + 1, device=device)  # [D+1]
        self.causal = self.rows[:, None] >= self.rows[None, :]  # [D+1, D+1]
        self.chain_tokens = torch.zeros(depth + 1, dtype=torch.long, device=device)
        self.chain_nodes = torch.full((depth + 1,), -1, dtype=torch.long, device=device)  # tree node of each row

    @property
    def feature_layers(self) -> List[int]:
        return list(self.model.feature_layers)

    def state_tensors(self) -> List[torch.Tensor]:
        return [self.chain_tokens, self.chain_nodes] + self.model.state_tensors()

    def prefill(self, prompt_ids: torch.Tensor, count: torch.Tensor, features: Dict[int, torch.Tensor]) -> None:
        self.model.prefill(prompt_ids, count, features)

    def narrow(self, tree: DraftTree, prefix_len: torch.Tensor) -> DraftTree:
        """The drafted tree -> the chain the target verifies: the small model's greedy path through the tree, then
        its own next token (when the path is shorter than the depth), then padding. All on the device."""
        logits = self.model.logits(tree.tokens, prefix_len + tree.depths, prefix_len, tree.tree_mask)  # [N, V]
        path, length, own_next = verify_greedy(logits, tree.tokens, tree.parents, self.depth)  # [D+1], [1], [1]
        tokens = torch.where(self.rows == length + 1, own_next, tree.tokens[path.clamp(min=0)])  # [D+1]
        valid = self.rows <= length + 1
        self.chain_tokens.copy_(tokens)
        self.chain_nodes.copy_(torch.where(self.rows <= length, path, -1))
        return DraftTree(tokens=tokens, parents=torch.where(valid, self.rows - 1, -1), depths=self.rows,
                         valid=valid, tree_mask=self.causal, joint_logprobs=torch.zeros_like(tokens, dtype=torch.float))

    def commit(self, features: Dict[int, torch.Tensor], accepted_rows: torch.Tensor, accept_length: torch.Tensor,
               start: torch.Tensor, count: torch.Tensor) -> None:
        """The target accepted chain rows accepted_rows [D+1] (0..accept_length, then -1): hand them to the model
        (their features {i: [D+1, H]}, confirmed from slot start [1], count [1] of them)."""
        confirmed = self.rows <= accept_length
        tree_nodes = torch.where(confirmed, self.chain_nodes, -1)  # [D+1]
        self.model.commit(features, tree_nodes, self.chain_tokens.index_select(0, accept_length), start, count)


class CompactIntermediate:
    """A separate small model of the target's tokenizer as the intermediate (module docstring: its lagging token).
    `rope_tables` (cos, sin) [max_len, D]: the small model's own."""

    feature_layers: List[int] = []

    def __init__(self, model: VerifierModel, rope_tables):
        self.model, self.rope_tables = model, rope_tables

    def allocate(self, max_len: int, device: torch.device, dtype: torch.dtype) -> None:
        self.model.allocate(max_len, *self.rope_tables)
        self.last_token = torch.zeros(1, dtype=torch.long, device=device)  # the token at slot prefix - 1
        self.empty = torch.zeros(1, dtype=torch.long, device=device)  # the prefill writes from slot 0

    def state_tensors(self) -> List[torch.Tensor]:
        return [self.model.k_cache, self.model.v_cache, self.last_token]

    def prefill(self, prompt_ids: torch.Tensor, count: torch.Tensor, features: Dict[int, torch.Tensor]) -> None:
        positions = torch.arange(prompt_ids.shape[0], device=prompt_ids.device)  # [R]
        self.model.run_layers(self.model.embed(prompt_ids), positions, self.empty, None)
        self.last_token.copy_(prompt_ids.index_select(0, count - 1))

    def logits(self, tokens: torch.Tensor, positions: torch.Tensor, prefix_len: torch.Tensor,
               tree_mask: torch.Tensor) -> torch.Tensor:
        """The last confirmed token at slot prefix_len - 1, then the tree's N nodes -> the nodes' logits [N, V]."""
        rows = torch.cat([self.last_token, tokens])  # [N+1]
        row_positions = torch.cat([positions[:1] - 1, positions])  # [N+1]
        mask = torch.nn.functional.pad(tree_mask, (1, 0, 1, 0))  # [N+1, N+1]
        mask[:, 0] = True  # every row sees the lagging token, which sees itself alone
        hidden, _ = self.model.run_layers(self.model.embed(rows), row_positions, prefix_len - 1, mask)
        return self.model.logits(hidden[1:])

    def commit(self, features: Dict[int, torch.Tensor], tree_nodes: torch.Tensor, last_token: torch.Tensor,
               start: torch.Tensor, count: torch.Tensor) -> None:
        """Moves the confirmed nodes' KV (tree node i at slot start + i) to slots start..start+count-1; a row that
        was no tree node copies an unused slot past the tree (increasing, as `compact_kv` takes them), rewritten by
        the next pass's lagging token."""
        rows = torch.arange(tree_nodes.shape[0], device=tree_nodes.device)
        past_tree = self.model.max_len - tree_nodes.shape[0] + rows  # [M] the cache's last M slots
        src = torch.where(tree_nodes >= 0, start + tree_nodes, past_tree)
        compact_kv(self.model.k_cache, self.model.v_cache, src, start, count)
        self.last_token.copy_(last_token)


def hierarchical_stage(intermediate: Optional[IntermediateModel], narrow: bool, shape, max_len: int,
                       device: torch.device, dtype: torch.dtype) -> Optional[HierarchicalStage]:
    """The stage that narrows trees through `intermediate` (None: none). `narrow`: the cycle is a chain or a
    verify above the shallow layers, an error with an intermediate model (the narrowed chain runs every layer)."""
    if intermediate is None:
        return None
    if narrow:
        raise SpecdraftError("an intermediate model (runtime.intermediate) narrows a tree: drop --chain and "
                             "--shallow-reuse-tree")
    return HierarchicalStage(intermediate, shape.depth, max_len, device, dtype)
