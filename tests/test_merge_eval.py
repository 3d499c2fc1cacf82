"""tools/merge_eval.py: reports of disjoint prompt ranges merge into the report of the whole range. CPU."""

import pytest

from specdraft.decoding.stats import acceptance_by_position
from tools.merge_eval import merge


def _report(accepted, k=3):
    return {"tau": sum(a + 1 for a in accepted) / len(accepted), "cycles": len(accepted),
            "acceptance_by_position": acceptance_by_position(accepted, k),
            "accepted_histogram": [accepted.count(a) for a in range(k + 1)], "lossless": True, "prompts": 1,
            "lossless_prompts": 1, "new_tokens": 5, "seconds_speculative": 1.0, "seconds_greedy_hf": 2.0,
            "settings": {"depth": k}}


def test_merge_equals_the_report_of_all_cycles():
    first, second = [0, 3, 1, 2], [3, 3, 0]
    merged, whole = merge([_report(first), _report(second)]), _report(first + second)
    assert merged["tau"] == pytest.approx(whole["tau"])
    assert merged["acceptance_by_position"] == pytest.approx(whole["acceptance_by_position"])
    assert merged["prompts"] == 2 and merged["lossless"] is True
