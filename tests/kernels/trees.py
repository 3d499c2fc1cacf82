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
