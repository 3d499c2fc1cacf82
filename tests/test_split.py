"""The train/val split: deterministic, a prompt's rows on one side when two distilled sets answer the same
prompts, and the same split as before for a set of one row a prompt."""
import numpy as np
from datasets import Dataset

from specdraft.train.data import prompt_groups, split_distilled, split_indices


def _rows(sources_and_indices):
    return Dataset.from_dict({"source": [s for s, _ in sources_and_indices], "index": [i for _, i in sources_and_indices],
                              "input_ids": [[1, 2]] * len(sources_and_indices)})


def _old_split(num_rows, val_fraction, seed):  # the split before groups: a permutation of the rows
    order = np.random.default_rng(seed).permutation(num_rows)
    num_val = min(num_rows - 1, max(1, round(num_rows * val_fraction)))
    return np.sort(order[num_val:]), np.sort(order[:num_val])


def _split(dataset, val_fraction, seed):
    return split_indices(len(dataset), val_fraction, seed, prompt_groups(dataset))


def test_one_row_a_prompt_splits_as_before():
    prompts = [("a.jsonl", i) for i in range(300)] + [("b.jsonl", i) for i in range(200)]
    for seed in (0, 1, 7):
        train, val = _split(_rows(prompts), 0.02, seed)
        old_train, old_val = _old_split(500, 0.02, seed)
        assert np.array_equal(train, old_train) and np.array_equal(val, old_val)


def test_two_answers_of_a_prompt_fall_on_one_side():
    prompts = [("a.jsonl", i) for i in range(400)]
    dataset = _rows(prompts + prompts[::-1])  # a greedy set, then a sampled one in another order
    groups = prompt_groups(dataset)
    assert groups.max() == 399 and np.array_equal(groups[:400], np.arange(400))
    train, val = _split(dataset, 0.05, 0)
    assert len(train) + len(val) == 800 and 40 <= len(val) <= 41
    assert not set(groups[train]) & set(groups[val])
    assert np.array_equal(_split(dataset, 0.05, 0)[1], val)  # deterministic


def test_rows_without_prompt_ids_split_by_row():
    dataset = Dataset.from_dict({"input_ids": [[1]] * 50})
    assert prompt_groups(dataset) is None
    assert np.array_equal(_split(dataset, 0.1, 3)[1], _old_split(50, 0.1, 3)[1])
    assert len(split_indices(5, 0.5, 0, groups=np.zeros(5, dtype=int))[1]) == 2  # one group: rows split


def test_two_distilled_sets_on_disk_split_by_prompt(tmp_path):
    prompts = [("a.jsonl", i) for i in range(100)]
    for name, rows in (("greedy", prompts), ("sampled", prompts[50:] + prompts[:50])):
        _rows(rows).save_to_disk(str(tmp_path / name / "dataset"))
    train, val = split_distilled([str(tmp_path / "greedy"), str(tmp_path / "sampled")], 200, 0.1, 0)
    prompt_of = np.array(list(range(100)) + list(range(50, 100)) + list(range(50)))
    assert len(val) == 20 and not set(prompt_of[train]) & set(prompt_of[val])
