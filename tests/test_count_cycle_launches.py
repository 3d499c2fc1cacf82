"""tools/count_cycle_launches.py on a tiny target: every phase of a cycle counted, against a plain step; a tree
pruned by a C2T scorer during the expansion costs one launch a depth more (from the selection, a few more), and
no cycle syncs with the host."""
import json

import pytest

from tools import count_cycle_launches as tool


@pytest.mark.triton_kernels
def test_a_cycle_is_counted_phase_by_phase_against_a_plain_step(tmp_path, capsys):
    report = tool.main(["--config", "tiny", "--shapes", "3", "3,2,6", "--prune", "0.5", "--out", str(tmp_path)])
    chain, tree, pruned, selected = report["rows"]
    assert report["plain_step"] > 0 and "triton:_rms_norm_kernel" in report["plain_ops"]
    assert chain["verify"] == report["plain_step"]  # one target pass and its argmax, whatever the chain's length
    for row in (chain, tree):
        assert row["cycle"] == row["draft"] + row["verify"] + row["bookkeeping"]
        assert row["tau_for_goal"] == pytest.approx(2.5 * row["cycle"] / report["plain_step"])
    assert tree["draft_ops"]["triton:_select_kernel"] == 1  # the tree's selection is one launch
    assert all(row["host_syncs"] == 0 for row in report["rows"])  # each cycle fits one CUDA graph
    assert pruned["prune_threshold"] == 0.5 and pruned["draft_ops"]["triton:_prune_children_kernel"] == 3
    assert pruned["prune_at"] == "expansion" and pruned["draft"] == tree["draft"] + 3  # one launch a depth
    assert selected["prune_at"] == "selection" and selected["draft_ops"]["triton:_prune_children_kernel"] == 3
    assert selected["draft"] <= tree["draft"] + 3 + 18  # and its mask, dropped from the selection
    assert "topk" not in tree["draft_ops"] and "sort" not in tree["draft_ops"]
    assert json.loads((tmp_path / "cycle_launches.json").read_text()) == report
    assert "tau for 2.5x" in capsys.readouterr().out


@pytest.mark.triton_kernels
def test_a_sampled_cycle_is_counted_and_its_acceptance_does_not_walk_depth_by_depth():
    """T=1 against T=0 on one tree: the host's draws outside the graph counted apart, no host sync, and the
    rejection sampling's acceptance and the sampled children in a few fused launches (`kernels.tree_sample`,
    `kernels.sampled_topk`), not op by op."""
    report = tool.count("tiny", ["3,2,6"], temperatures=(0.0, 1.0), point_mass=True)
    greedy, sampled, point_mass = report["rows"]
    assert (greedy["drafts"], sampled["drafts"], point_mass["drafts"]) == ("-", "sampled", "point mass")
    # uniforms (+ the drafts' Exp(1) noise), each with its copy into the graph; the noise's -log taken in the graph
    assert greedy["draws"] == 0 and point_mass["draws"] == 2 and sampled["draws"] == 4
    assert all(row["host_syncs"] == 0 for row in report["rows"])
    for row in report["rows"]:
        assert row["cycle"] == row["draws"] + row["draft"] + row["verify"] + row["bookkeeping"]
    assert point_mass["draft"] == greedy["draft"] and point_mass["verify"] == greedy["verify"]
    # the acceptance: three kernels from the logits against the greedy's two (walked depth by depth in PyTorch ops:
    # 74 more, and 110 with sampled drafts; all at once in PyTorch ops: 54, and 81)
    assert point_mass["bookkeeping"] - greedy["bookkeeping"] <= 2
    assert sampled["bookkeeping"] - greedy["bookkeeping"] <= 2
    assert sampled["bookkeeping_ops"]["triton:_accept_kernel"] == 1 and "cumsum" not in sampled["bookkeeping_ops"]
    # sampled children: two kernels a depth as draft_topk's; what the verify reads of them, five launches (by
    # PyTorch ops, two top-k and three concatenations: 40)
    assert sampled["draft"] - greedy["draft"] <= 6


@pytest.mark.triton_kernels
def test_a_vispec_cycle_adds_one_launch_a_drafting_step_and_three_to_its_ingest():
    """A ViSpec draft after an image prompt, against EAGLE-3's on the same shapes: img_fc is one matmul onto the
    image's global term at each step after the first, and a cycle's ingest (bookkeeping) is EAGLE-3's at shifted
    slots; the verify is the target's alone, and the cycle still holds no host sync."""
    report = tool.count("tiny", ["3,2,6", "4"], vispec=True)
    rows = {(row["shape"], row["method"]): row for row in report["rows"]}
    for shape, depth in (("3,2,6", 3), ("4", 4)):
        eagle3, vispec = rows[shape, "eagle3"], rows[shape, "vispec"]
        assert vispec["draft"] == eagle3["draft"] + depth - 1
        assert vispec["verify"] == eagle3["verify"] and vispec["bookkeeping"] <= eagle3["bookkeeping"] + 3
        assert vispec["host_syncs"] == 0
