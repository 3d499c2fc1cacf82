"""Lossless sampling at T > 0: the first token a cycle emits, and the second given an accepted first, follow the
target's distribution exactly, with point-mass drafts and with sampled ones (sampled_drafts.py). A chi-square test
on a 6-token vocabulary with a fixed seed; a broken acceptance rule fails it."""
import torch

from specdraft.kernels.tree_sample import reference as acceptance
from specdraft.kernels.tree_select import select_tree
from specdraft.decoding import sampling
from specdraft.decoding.sampled_drafts import SampledDrafts
from specdraft.decoding.tree import DraftTree
from tests.kernels.trees import ancestor_mask, padded_expansion, random_parents

VOCAB, TRIALS = 6, 3000


def _tree_and_logits():
    """Root 0 with children tokens 4, 1 (nodes 1, 2); node 1 has children 1, 3 (nodes 3, 4)."""
    tokens = torch.tensor([0, 4, 1, 1, 3])
    parents = torch.tensor([-1, 0, 0, 1, 1])
    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(5, VOCAB, generator=generator) * 1.5
    mask = torch.eye(5, dtype=torch.bool)
    tree = DraftTree(tokens=tokens, parents=parents, depths=torch.tensor([0, 1, 1, 2, 2]),
                     valid=torch.ones(5, dtype=torch.bool), tree_mask=mask, joint_logprobs=torch.zeros(5))
    return tree, logits


def _emitted(tree, logits, nodes, length, bonus):
    path = [n for n in nodes.tolist() if n >= 0]
    return [int(tree.tokens[n]) for n in path[1:]] + [int(bonus)]


def _chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected.clamp(min=1e-9)).sum())


def _sample_counts():
    tree, logits = _tree_and_logits()
    generator = torch.Generator().manual_seed(0)
    first = torch.zeros(VOCAB)
    second_after_node1 = torch.zeros(VOCAB)
    for _ in range(TRIALS):
        uniforms = sampling.draw_uniforms(tree.tokens.shape[0], generator, torch.device("cpu"))
        out = _emitted(tree, logits, *sampling.verify_sampling(logits, tree, 2, 1.0, uniforms))
        first[out[0]] += 1
        if len(out) > 1 and out[0] == 4:  # node 1 accepted: the next token is drawn at node 1
            second_after_node1[out[1]] += 1
    return logits, first, second_after_node1


# chi-square critical value, 5 degrees of freedom, p = 0.001
CRITICAL = 20.5


def test_emitted_tokens_follow_the_target_distribution():
    logits, first, second = _sample_counts()
    assert _chi_square(first, torch.softmax(logits[0], -1)) < CRITICAL
    assert _chi_square(second, torch.softmax(logits[1], -1)) < CRITICAL


def test_a_broken_acceptance_rule_is_caught(monkeypatch):
    def forgets_rejected(probs, tokens, rejected):  # the bonus may resample a rejected child
        return probs

    monkeypatch.setattr(acceptance, "_ban_rejected", forgets_rejected)
    logits, first, _ = _sample_counts()
    assert _chi_square(first, torch.softmax(logits[0], -1)) > CRITICAL


def test_a_walk_that_forgets_earlier_rejections_is_caught(monkeypatch):
    forgets = lambda probs, earlier: torch.ones_like(probs)  # noqa: E731 (later children accepted too rarely)
    monkeypatch.setattr(acceptance, "_remaining_mass", forgets)
    logits, first, _ = _sample_counts()
    assert _chi_square(first, torch.softmax(logits[0], -1)) > CRITICAL


def test_temperature_zero_sampling_is_argmax():
    logits = torch.tensor([[0.1, 3.0, 0.2]])
    assert int(sampling.sample_token(logits, 0.0)) == 1


def test_padding_under_no_node_is_never_accepted_nor_banned():
    """Node 2 is padding (parent -1, as `select_tree` leaves it): the walk never accepts it, and when node 1 is
    rejected the bonus may still be node 2's token (only rejected children are banned)."""
    tree, logits = _tree_and_logits()
    tree.parents = torch.tensor([-1, 0, -1, 1, 1])
    tree.valid = torch.tensor([True, True, False, True, True])
    logits[0] = torch.tensor([0.0, 4.0, 0.0, 0.0, -9.0, 0.0])  # the target prefers token 1, node 2's
    generator = torch.Generator().manual_seed(1)
    bonus_tokens = set()
    for _ in range(200):
        uniforms = sampling.draw_uniforms(5, generator, torch.device("cpu"))
        nodes, length, bonus = sampling.verify_sampling(logits, tree, 2, 1.0, uniforms)
        assert 2 not in nodes.tolist()
        if int(length) == 0:
            bonus_tokens.add(int(bonus))
    assert 1 in bonus_tokens


def test_selected_padding_is_never_accepted():
    """select_tree's padding (a kept candidate whose parent was not kept) carries the token the target all but
    surely samples at the root, and no real child of the root does: the walk never accepts it. Hung under the root
    instead, it would be (its draft probability is 0)."""
    tokens, parents, scores = padded_expansion(vocab=VOCAB)
    selection = select_tree(tokens, parents, scores, 8, 3)
    tree = DraftTree(tokens=selection.tokens, parents=selection.parents, depths=selection.depths,
                     valid=selection.valid, tree_mask=selection.tree_mask, joint_logprobs=selection.joint_logprobs)
    target_logits = torch.zeros(8, VOCAB)  # [N, V]
    target_logits[0, tokens[5]] = 20.0
    generator = torch.Generator().manual_seed(1)
    for _ in range(50):
        uniforms = sampling.draw_uniforms(8, generator, torch.device("cpu"))
        nodes, length, bonus = sampling.verify_sampling(target_logits, tree, 3, 1.0, uniforms)
        assert 5 not in nodes.tolist() and int(length) == 0 and int(bonus) == tokens[5]


def _sampled_tree(draft_logprobs, generator):
    """Root 0 with children: node 1 sampled from q_0, node 2 the likeliest other token of q_0; node 1 with
    children: node 3 sampled from q_1, node 4 the likeliest other token of q_1 (the tree sampled_drafts builds)."""
    tokens = [0]
    for row in range(2):
        gumbel = -torch.empty(VOCAB).exponential_(generator=generator).log()
        sampled = int((draft_logprobs[row] + gumbel).argmax())
        other = int(draft_logprobs[row].scatter(0, torch.tensor([sampled]), float("-inf")).argmax())
        tokens += [sampled, other]
    parents = torch.tensor([-1, 0, 0, 1, 1])
    drafts = SampledDrafts(rows=torch.tensor([0, 1, -1, -1, -1]), logprobs=draft_logprobs,
                           d2t=torch.zeros(VOCAB, dtype=torch.long), sampled=torch.tensor([0, 1, 0, 1, 0]) > 0)
    return DraftTree(tokens=torch.tensor(tokens), parents=parents, depths=torch.tensor([0, 1, 1, 2, 2]),
                     valid=torch.ones(5, dtype=torch.bool), tree_mask=torch.eye(5, dtype=torch.bool),
                     joint_logprobs=torch.zeros(5), sampled=drafts)


def _sampled_counts(trials=TRIALS):
    _, logits = _tree_and_logits()
    draft_logprobs = torch.log_softmax(logits[:2] + torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(5)),
                                       dim=-1)  # [2, V] a draft near the target, not equal to it
    generator = torch.Generator().manual_seed(0)
    first, second_after_node1, accepted = torch.zeros(VOCAB), torch.zeros(VOCAB), 0
    for _ in range(trials):
        tree = _sampled_tree(draft_logprobs, generator)
        uniforms = sampling.draw_uniforms(5, generator, torch.device("cpu"))
        nodes, length, bonus = sampling.verify_sampling(logits, tree, 2, 1.0, uniforms)
        out = _emitted(tree, logits, nodes, length, bonus)
        first[out[0]] += 1
        accepted += int(length)
        if 1 in nodes.tolist():  # node 1 accepted: the next token is drawn at node 1
            second_after_node1[out[1]] += 1
    return logits, first, second_after_node1, accepted


def test_sampled_drafts_keep_the_target_distribution():
    logits, first, second, _ = _sampled_counts()
    assert _chi_square(first, torch.softmax(logits[0], -1)) < CRITICAL
    assert _chi_square(second, torch.softmax(logits[1], -1)) < CRITICAL


def test_a_sampled_draft_accepted_without_its_ratio_is_caught(monkeypatch):
    q_near_zero = lambda rows, logprobs, d2t, vocab: torch.full((5, vocab), 1e-9)  # noqa: E731
    monkeypatch.setattr(acceptance, "_draft_probs", q_near_zero)
    logits, first, _, _ = _sampled_counts(TRIALS // 2)  # the sampled child always accepted: the draft's q
    assert _chi_square(first, torch.softmax(logits[0], -1)) > CRITICAL


def test_sampled_drafts_accept_more_than_point_masses_of_a_near_draft():
    """The same draft: its sampled first children accepted with min(1, p/q) land more often than its top-2 tokens
    as point masses."""
    logits, _, _, sampled = _sampled_counts(1000)
    _, point_logits = _tree_and_logits()
    generator, point = torch.Generator().manual_seed(0), 0
    draft_logprobs = torch.log_softmax(logits[:2] + torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(5)),
                                       dim=-1)
    for _ in range(1000):
        tree = _sampled_tree(draft_logprobs, generator)
        top = [int(i) for row in draft_logprobs for i in row.topk(2).indices]
        tree.tokens, tree.sampled = torch.tensor([0, *top]), None
        uniforms = sampling.draw_uniforms(5, generator, torch.device("cpu"))
        point += int(sampling.verify_sampling(point_logits, tree, 2, 1.0, uniforms)[1])
    assert sampled > point


def _walked(logits, tree, depth_limit, uniforms):
    """The walk depth by depth, in Python: at each node its children in node order, a sampled one tested with its
    ratio, a point mass against the mass its earlier point-mass siblings left; the first that passes is taken."""
    drafts = tree.sampled
    draft_args = () if drafts is None else (drafts.rows, drafts.logprobs, drafts.d2t, drafts.sampled)
    child_probs, sampled, ratios, _ = acceptance._child_tests(torch.softmax(logits.float(), -1), tree.tokens,
                                                              tree.parents, *draft_args)
    parents, path = tree.parents.tolist(), [0]
    for _ in range(depth_limit):
        mass, taken = 1.0, None
        for child in (i for i, parent in enumerate(parents) if parent == path[-1]):
            if sampled[child]:
                passes = bool(uniforms[child] < ratios[child])
            else:
                passes, mass = bool(uniforms[child] * mass < child_probs[child]), mass - float(child_probs[child])
            if passes:
                taken = child
                break
        if taken is None:
            break
        path.append(taken)
    return path + [-1] * (depth_limit + 1 - len(path))


def test_the_acceptance_at_once_takes_the_path_a_walk_depth_by_depth_takes():
    generator = torch.Generator().manual_seed(0)
    for trial in range(150):
        parents = random_parents(int(torch.randint(2, 16, (), generator=generator)), generator)
        n = parents.shape[0]
        depths = torch.zeros(n, dtype=torch.long)
        for node in range(1, n):
            depths[node] = depths[parents[node]] + 1
        first_child = torch.tensor([node > 0 and int(parents[node]) not in parents[1:node].tolist()
                                    for node in range(n)])
        draft_logprobs = torch.log_softmax(torch.randn(n, VOCAB, generator=generator), -1)
        drafts = SampledDrafts(rows=torch.arange(n), logprobs=draft_logprobs,
                               d2t=torch.zeros(VOCAB, dtype=torch.long), sampled=first_child)
        tree = DraftTree(tokens=torch.randint(0, VOCAB, (n,), generator=generator), parents=parents, depths=depths,
                         valid=torch.ones(n, dtype=torch.bool), tree_mask=ancestor_mask(parents),
                         joint_logprobs=torch.zeros(n), sampled=drafts if trial % 2 else None)
        logits = torch.randn(n, VOCAB, generator=generator) * 2
        for depth_limit in range(1, int(depths.max()) + 1):
            uniforms = sampling.draw_uniforms(n, generator, torch.device("cpu"))
            accepted = sampling.verify_sampling(logits, tree, depth_limit, 1.0, uniforms)[0]
            assert accepted.tolist() == _walked(logits, tree, depth_limit, uniforms)
