"""Random draft trees for the kernel tests: parents in topological order and the ancestor mask."""
import torch


def random_parents(num_nodes: int, generator: torch.Generator, max_children: int = 3) -> torch.Tensor:
    """[N] int64, parents[0] = -1, parents[i] < i, at most `max_children` children per node."""
    parents = [-1]
    children = [0]
    for node in range(1, num_nodes):
        open_nodes = [i for i in range(node) if children[i] < max_children]
        parent = open_nodes[int(torch.randint(len(open_nodes), (), generator=generator))]
        children[parent] += 1
        parents.append(parent)
        children.append(0)
    return torch.tensor(parents, dtype=torch.int64)


def ancestor_mask(parents: torch.Tensor) -> torch.Tensor:
    """[N] parents -> [N, N] bool, mask[i, j]: j is i or an ancestor of i."""
    num_nodes = parents.shape[0]
    mask = torch.zeros(num_nodes, num_nodes, dtype=torch.bool)
    for node in range(num_nodes):
        ancestor = node
        while ancestor >= 0:
            mask[node, ancestor] = True
            ancestor = int(parents[ancestor])
    return mask


def depth(parents: torch.Tensor) -> int:
    depths = [0] * parents.shape[0]
    for node in range(1, parents.shape[0]):
        depths[node] = depths[int(parents[node])] + 1
    return max(depths)


def expansion_candidates(depth: int, topk: int, generator: torch.Generator, vocab: int = 49152):
    """A tree expansion's candidates as runtime/tree.py lays them out: the root, its topk children, then topk * topk
    a depth under the previous depth's best topk -> (tokens [C] int64, parents [C] int64, scores [C] float32),
    each score its parent's plus a log-probability (never above the parent's)."""
    tokens = [torch.randint(0, vocab, (1,), generator=generator)]
    parents, scores = [torch.tensor([-1])], [torch.zeros(1)]
    frontier_ids, frontier_scores = torch.zeros(1, dtype=torch.int64), torch.zeros(1)
    base = 1
    for _ in range(depth):
        count = frontier_ids.shape[0] * topk
        child_scores = frontier_scores.repeat_interleave(topk) - torch.rand(count, generator=generator) * 4
        tokens.append(torch.randint(0, vocab, (count,), generator=generator))
        parents.append(frontier_ids.repeat_interleave(topk))
        scores.append(child_scores)
        best = torch.sort(child_scores, descending=True, stable=True).indices[:topk]
        frontier_ids, frontier_scores, base = base + best, child_scores[best], base + count
    return torch.cat(tokens), torch.cat(parents), torch.cat(scores)


def padded_expansion(vocab: int = 49152):
    """expansion_candidates(3, 3) with every score below the root tied and candidate 5 hung under candidate 9: a
    budget of 8 keeps candidates 0..7, and 5, its parent left out, becomes padding. Candidate 5's token is one no
    child of the root carries -> (tokens [C] int64, parents [C] int64, scores [C] float32)."""
    tokens, parents, scores = expansion_candidates(3, 3, torch.Generator().manual_seed(4), vocab)
    scores[1:] = -1.0
    parents[5] = 9
    tokens[5] = next(token for token in range(vocab) if token not in tokens[1:4].tolist())
    return tokens, parents, scores
