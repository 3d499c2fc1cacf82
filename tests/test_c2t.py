"""C2T on a tiny target (CPU): traces of the runtime's own trees over a chat-trained EAGLE-3 base (counted,
resumable), a classifier trained on them that prunes the trees to fewer verified tokens with the target's own
output (trees, and a chain's early exit), and bad input as one line naming the value."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from specdraft import cli
from specdraft.config import RuntimeConfig
from specdraft.core.errors import SpecdraftError
from specdraft.core.types import DraftContext
from specdraft.decoding.tree import TreeShape, build_tree
from specdraft.drafts import load_draft
from specdraft.kernels.prune_children import child_inputs
from specdraft.methods.c2t import (C2TClassifier, C2TConfig, ClassifierScorer, c2t_loss, collate_traces,
                                   draft_digest)
from specdraft.methods.c2t.model import ENTROPY_TOP, candidate_features
from specdraft.methods.c2t.traces import TraceRecorder
from specdraft.runtime.load import load_runtime
from tests.distilled import CHAT_PROMPTS

pytestmark = pytest.mark.reference_kernels

TRACE = {"trace_depth": 3, "trace_topk": 3}
SHAPE = {"depth": 3, "topk": 3, "budget": 10}


def write_recipe(path, target, draft, prompts, work, **method):
    method_yaml = ", ".join(f"{k}: {v}" for k, v in {"name": "c2t", "draft": draft, **TRACE, **method}.items())
    path.write_text(f"""
target: {{path: {target}}}
method: {{{method_yaml}}}
data: {{prompts: [{prompts}], val_fraction: 0.25}}
distill: {{output_dir: {work / 'traces'}, shard_size: 3, max_new_tokens: 24}}
train: {{output_dir: {work / 'run'}, max_steps: 40, micro_batch_size: 2, val_every_steps: 20, lr: 1.0e-2,
         warmup_steps: 1, log_every_steps: 10}}
""")
    return path


@pytest.fixture(scope="module")
def trained(tiny_target_dir, chat_base_export, tmp_path_factory):
    """distill-data (one conversation without a user turn among the chat prompts), train and export, once."""
    work = tmp_path_factory.mktemp("c2t")
    prompts = work / "prompts.jsonl"
    lines = [{"prompt": text} for text in CHAT_PROMPTS[:8]] + [{"messages": [{"role": "assistant", "content": "hi"}]}]
    prompts.write_text("".join(json.dumps(line) + "\n" for line in lines))
    recipe = write_recipe(work / "c2t.yaml", tiny_target_dir, chat_base_export, prompts, work)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPECDRAFT_KERNELS", "reference")
        torch.manual_seed(0)
        assert cli.main(["distill-data", str(recipe)]) == 0
        assert cli.main(["train", str(recipe)]) == 0
        assert cli.main(["export", str(work / "run"), "--out", str(work / "export"), "--dtype", "float32"]) == 0
    return {"work": work, "recipe": recipe, "prompts": prompts, "export": work / "export"}


@pytest.fixture(scope="module")
def extended(trained, tmp_path_factory):
    """A classifier of the extended features, trained on the same traces and exported."""
    work = tmp_path_factory.mktemp("c2t_extended")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPECDRAFT_KERNELS", "reference")
        torch.manual_seed(0)
        assert cli.main(["train", str(trained["recipe"]), "method.features=extended",
                         f"train.output_dir={work / 'run'}"]) == 0
        assert cli.main(["export", str(work / "run"), "--out", str(work / "export"), "--dtype", "float32"]) == 0
    return {"export": work / "export"}


def test_traces_are_counted_labelled_and_resumed(trained, chat_base_export):
    from datasets import load_from_disk

    work = trained["work"]
    assert json.loads((work / "traces" / "counts.json").read_text()) == {"input": 9, "ok": 8, "error": 0,
                                                                          "skipped": 1}
    rows = load_from_disk(str(work / "traces" / "dataset"))
    digest = draft_digest(load_draft(chat_base_export).draft)
    for row in rows:
        assert row["draft_digest"] == digest and row["cycles"] > 0
        assert sum(row["label"]) == row["accepted"] and 2 * row["accepted"] <= len(row["label"])
        assert set(row["depth"]) <= {1, 2, 3}
    assert sum(row["accepted"] for row in rows) > len(rows)  # the base drafts what the target accepts
    shards = sorted((work / "traces" / "shards").iterdir())
    written = [shard.stat().st_mtime for shard in shards]
    assert cli.main(["distill-data", str(trained["recipe"])]) == 0  # resumed: nothing rewritten
    assert [shard.stat().st_mtime for shard in shards] == written


def _decode(export, prompts, **settings):
    """Each prompt decoded speculatively and plainly -> (mean verified tokens a cycle, τ, outputs all equal)."""
    runtime = load_runtime(export, RuntimeConfig(device="cpu", dtype="float32", max_len=256, **settings))
    engine, drafted, accepted, same = runtime.engine, [], [], True
    for text in prompts:
        prompt = runtime.encode_chat(text)
        result = engine.generate(prompt, 24, runtime.eos_ids)
        same &= result.tokens == engine.decode_plain(prompt, 24, runtime.eos_ids).tokens
        drafted, accepted = drafted + result.drafted, accepted + result.accepted
    return sum(drafted) / len(drafted), 1 + sum(accepted) / len(accepted), same


def test_pruned_trees_verify_fewer_tokens_with_the_same_output(trained, chat_base_export):
    prompts = CHAT_PROMPTS[:3] + ["an unseen question?"]
    unpruned, tau, same = _decode(chat_base_export, prompts, **SHAPE)
    assert same and unpruned == SHAPE["budget"] - 1 and tau > 1.5
    pruned, pruned_tau, same = _decode(trained["export"], prompts, **SHAPE)
    assert same and pruned < 0.8 * unpruned and pruned_tau > 1.0
    kept_all, all_tau, same = _decode(trained["export"], prompts, prune_threshold=0.0, **SHAPE)
    assert same and (kept_all, all_tau) == (unpruned, tau)  # β = 0 keeps every candidate: the unpruned tree


def test_a_chain_ends_where_the_classifier_drops_a_token(trained):
    runtime = load_runtime(trained["export"], RuntimeConfig(device="cpu", dtype="float32", chain=True, depth=4))
    assert runtime.engine.tree_scorer.threshold == C2TConfig.chain_threshold  # the chain's own β by default
    drafted, _, same = _decode(trained["export"], CHAT_PROMPTS[:2] + ["an unseen question?"], chain=True, depth=4,
                               prune_threshold=0.5)
    assert same and drafted < 4


@pytest.mark.parametrize("policy", [{"policy": "ddd"}, {"policy": "sam", "sam_merge": True, "sam_min_match": 2}],
                         ids=["ddd", "sam_merge"])
def test_the_classifier_prunes_a_drafting_policys_trees(trained, policy):
    """A policy's trees pruned too, each cycle's verified nodes read from the output (a retrieval policy's cycles
    emit more tokens than the tree's: the count sits past them), the output the target's own."""
    runtime = load_runtime(trained["export"], RuntimeConfig(device="cpu", dtype="float32", max_len=256, **SHAPE,
                                                            **policy))
    most = SHAPE["budget"] - 1 + (runtime.settings.sam_draft if policy["policy"] == "sam" else 0)
    for text in CHAT_PROMPTS[:2]:
        prompt = runtime.encode_chat(text)
        result = runtime.engine.generate(prompt, 24, runtime.eos_ids)
        assert result.tokens == runtime.engine.decode_plain(prompt, 24, runtime.eos_ids).tokens
        assert all(0 <= a <= d <= most for a, d in zip(result.accepted, result.drafted))


def test_scorer_computes_the_classifier_and_takes_a_new_threshold_in_place():
    cfg = C2TConfig(draft="x")
    classifier = C2TClassifier(cfg, DraftContext(target=None))
    scorer = ClassifierScorer(classifier, cfg, torch.device("cpu"))
    child_logprobs, parent_scores, parent_logits = -torch.rand(3, 4) * 3, -torch.rand(3), torch.randn(3, 50)
    for depth in (1, 4):
        joint, entropy = child_inputs(child_logprobs, parent_scores, parent_logits, ENTROPY_TOP)
        features = candidate_features(joint.flatten(), entropy[:, None].expand_as(joint).flatten(),
                                      torch.full((12,), depth))
        kept = torch.sigmoid(classifier(features)).view(3, 4) >= cfg.threshold
        pruned = scorer.prune(child_logprobs, parent_scores, parent_logits, depth)
        assert torch.equal(pruned > -float("inf"), kept)
        torch.testing.assert_close(pruned[kept], child_logprobs[kept])
    cut = scorer.weights.cut
    scorer.threshold = 0.0
    assert torch.equal(scorer.prune(child_logprobs, parent_scores, parent_logits, 2), child_logprobs)
    assert scorer.weights.cut is cut  # the same tensor: graphs see it
    scorer.threshold = 1.0
    assert (scorer.prune(child_logprobs, parent_scores, parent_logits, 2) == -float("inf")).all()


class _Both:
    """The runtime's scorer and the trace recorder given the same inputs at every depth: what the recorder keeps
    (as a trace row stores it) beside the runtime's decision (kept: a log-probability above -inf)."""

    def __init__(self, scorer):
        self.scorer, self.recorder, self.kept = scorer, TraceRecorder(), []
        self.threshold, self.chain_threshold = scorer.threshold, scorer.chain_threshold

    def prune(self, child_logprobs, parent_scores, parent_logits, depth):
        self.recorder.prune(child_logprobs, parent_scores, parent_logits, depth)
        pruned = self.scorer.prune(child_logprobs, parent_scores, parent_logits, depth)
        self.kept.append((pruned > -float("inf")).flatten())
        return pruned


@pytest.mark.parametrize("features", ["paper", "extended"])
@pytest.mark.parametrize("kernels", ["reference", pytest.param("auto", marks=pytest.mark.triton_kernels)])
def test_training_reads_the_features_the_runtime_scores(trained, extended, monkeypatch, kernels, features):
    """A few pruned cycles: every candidate's features as a trace row records them, read back by training's
    collate and classifier, give the runtime scorer's own decision (the fused kernel's, or its reference's), for
    either feature set."""
    monkeypatch.setenv("SPECDRAFT_KERNELS", kernels)
    export = trained["export"] if features == "paper" else extended["export"]
    runtime = load_runtime(export, RuntimeConfig(device="cpu", dtype="float32", max_len=256, **SHAPE))
    engine, classifier = runtime.engine, load_draft(export).draft
    both = _Both(engine.tree_scorer)
    engine.set_tree_scorer(both)
    engine.prefill(torch.tensor(runtime.encode_chat(CHAT_PROMPTS[0])), 0.0)
    kept, decided = 0, 0
    for _ in range(4):
        tree = engine.build_tree()
        engine.accept_and_commit(engine.acceptance(0.0), tree, engine.verify_forward(tree))
        columns = both.recorder.take()
        row = {**{name: column.tolist() for name, column in columns.items()}, "label": [0] * len(columns["depth"]),
               "draft": "d", "draft_digest": "x"}
        with torch.no_grad():
            logits = classifier(collate_traces([row])["features"])  # [C - 1] as training computes them
        runtime_kept = torch.cat(both.kept)
        both.kept = []
        clear = (torch.sigmoid(logits) - both.threshold).abs() > 1e-5
        assert torch.equal((torch.sigmoid(logits) >= both.threshold)[clear], runtime_kept[clear])
        kept, decided = kept + int(runtime_kept.sum()), decided + runtime_kept.numel()
    assert 0 < kept < decided  # the classifier dropped some candidates, kept others


def test_traces_of_a_budget_label_only_the_nodes_it_verifies(trained, chat_base_export, tiny_target_dir, tmp_path):
    """method.trace_budget: each traced tree verifies its budget's best by joint probability, and every kept
    candidate (accepted or not) is one of them: at most budget - 1 a tree, their joint probabilities above those
    of the candidates a whole-expansion trace keeps."""
    from datasets import load_from_disk

    budget = 6
    recipe = write_recipe(tmp_path / "budget.yaml", tiny_target_dir, chat_base_export, trained["prompts"], tmp_path,
                          trace_budget=budget, negatives_per_positive=100)
    assert cli.main(["distill-data", str(recipe)]) == 0
    rows = load_from_disk(str(tmp_path / "traces" / "dataset"))
    whole = load_from_disk(str(trained["work"] / "traces" / "dataset"))
    for row in rows:
        assert row["candidates"] == row["cycles"] * (budget - 1)  # every verified node but the root
        assert row["accepted"] < len(row["label"]) <= row["candidates"]  # only verified nodes are kept
        assert sum(row["label"]) == row["accepted"]
    budget_joint = torch.tensor([p for row in rows for p in row["joint_logprob"]]).mean()
    whole_joint = torch.tensor([p for row in whole for p in row["joint_logprob"]]).mean()
    assert budget_joint > whole_joint


def test_a_budget_of_every_candidate_verifies_the_whole_expansion(chat_base_export, tiny_target_dir):
    from specdraft.decoding.engine import SpecEngine
    from specdraft.decoding.verifier import from_hf, hf_rope_tables
    from specdraft.targets import load_target
    from specdraft.config import TargetConfig
    from specdraft.drafts import as_base

    target = load_target(TargetConfig(path=str(tiny_target_dir)), "cpu")
    model = from_hf(target.model, target.info)
    drafter = as_base(load_draft(chat_base_export)).runtime(model)
    shape = TreeShape(3, 3, 22)  # budget: every candidate
    engine = SpecEngine(model, drafter, shape, 128, hf_rope_tables(target.model, 128), use_graphs=False)
    engine.prefill(torch.tensor([5, 9, 14, 3]), 0.0)
    tree = build_tree(drafter, shape, engine.root, engine.prefix_len)
    assert tree.valid.all() and torch.equal(tree.candidate_ids, torch.arange(22))
    assert torch.bincount(tree.depths).tolist() == [1, 3, 9, 9]  # root, k, then k*k children per later depth
    ancestor = tree.parents[:, None] == torch.arange(22)[None, :]
    assert (tree.tree_mask >= ancestor).all() and tree.tree_mask.sum(1).tolist() == (tree.depths + 1).tolist()


def test_an_export_without_its_draft_is_one_line_naming_it(trained, tmp_path):
    broken = tmp_path / "export"
    shutil.copytree(trained["export"], broken)
    shutil.rmtree(broken / "draft")
    with pytest.raises(SpecdraftError, match=f"{broken / 'draft'} does not exist"):
        load_runtime(broken, RuntimeConfig(device="cpu"))
    config = json.loads((broken / "config.json").read_text())
    del config["specdraft"]["base"]
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(SpecdraftError, match="carries no draft to prune") as err:
        load_runtime(broken, RuntimeConfig(device="cpu"))
    assert "\n" not in str(err.value)


def test_an_export_of_unscaled_features_is_one_line(trained, tmp_path):
    """A classifier exported before its features were scaled (no feature_scale) would score other numbers than it
    was trained on: refused in one line."""
    old = tmp_path / "export"
    shutil.copytree(trained["export"], old)
    tensors = load_file(old / "model.safetensors")
    del tensors["feature_scale"]
    save_file(tensors, str(old / "model.safetensors"))
    with pytest.raises(SpecdraftError, match="reads unscaled features") as err:
        load_runtime(old, RuntimeConfig(device="cpu"))
    assert "\n" not in str(err.value)


def test_a_base_without_a_draft_is_one_line_naming_it(trained, tiny_target_dir, chat_base_export, tmp_path, capsys):
    empty = tmp_path / "empty"
    shutil.copytree(chat_base_export, empty)
    (empty / "model.safetensors").unlink()
    for draft, message in ((empty, f"weights file not found: {empty / 'model.safetensors'}"),
                           ('""', "method.draft is empty")):
        recipe = write_recipe(tmp_path / "bad.yaml", tiny_target_dir, draft, trained["prompts"], tmp_path / "w")
        assert cli.main(["distill-data", str(recipe)]) == 2
        error = capsys.readouterr().err.strip().splitlines()[-1]
        assert message in error


def test_traces_of_another_draft_are_refused(trained, tiny_target_dir, chat_base_export, tmp_path, capsys):
    other = tmp_path / "other"
    shutil.copytree(chat_base_export, other)
    tensors = load_file(other / "model.safetensors")
    tensors["fc.weight"] = tensors["fc.weight"] * 1.01
    save_file(tensors, str(other / "model.safetensors"))
    work = trained["work"]
    recipe = write_recipe(tmp_path / "other.yaml", tiny_target_dir, other, trained["prompts"], tmp_path / "w")
    assert cli.main(["train", str(recipe), f"distill.output_dir={work / 'traces'}"]) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"trace rows recorded over draft {chat_base_export}" in error and f"method.draft {other}" in error


def test_bench_sweeps_the_prune_threshold(trained, tmp_path):
    prompts = tmp_path / "bench.jsonl"
    prompts.write_text("".join(json.dumps({"turns": [text]}) + "\n" for text in CHAT_PROMPTS[:2]))
    args = ["bench", str(trained["export"]), "--device", "cpu", "--dtype", "float32", "--prompts", str(prompts),
            "--temperature", "0", "--no-hf", "--lossless-prompts", "1", "--max-new-tokens", "16", "--out",
            str(tmp_path / "bench"), "--prune-sweep", "0.3", "0.7", *sum(([f"--{k}", str(v)] for k, v in SHAPE.items()),
                                                                          [])]
    assert cli.main(args) == 0
    report = json.loads((tmp_path / "bench" / "bench.json").read_text())
    sweep = report["prune_sweep"]
    assert [row["prune_threshold"] for row in sweep] == [None, 0.3, 0.7]
    assert sweep[0]["verified_per_cycle"] == SHAPE["budget"] and all(row["lossless"] for row in sweep)
    assert sweep[2]["verified_per_cycle"] <= sweep[1]["verified_per_cycle"] <= sweep[0]["verified_per_cycle"]
    assert report["runs"][0]["prune_threshold"] == 0.5 and report["lossless_float32"] is True
    assert (tmp_path / "bench" / "bench.png").stat().st_size > 0


def test_bench_sweeps_around_the_drafts_own_threshold_by_default(trained, monkeypatch):
    """No --prune-sweep: β at PRUNE_SWEEP_SCALES times the scorer's own (the export's method.threshold, 0.5)."""
    from specdraft.runtime import bench

    runtime = load_runtime(trained["export"], RuntimeConfig(device="cpu", dtype="float32", max_len=256, **SHAPE))
    asked = []
    monkeypatch.setattr(bench, "prune_runs", lambda runtime, prompts, settings, plain, variants: asked.extend(variants))
    bench.sweep_prune_thresholds(runtime, [], bench.BenchSettings(), [])
    assert asked == [None, *((beta, "selection", "kept") for beta in (0.25, 0.375, 0.5, 0.625, 0.75))]


@pytest.mark.gpu
def test_pruned_trees_and_chains_run_in_cuda_graphs_and_take_a_new_threshold(trained):
    """The scorer inside the captured cycle: β set after the capture reaches the graph (its logit lives in a device
    tensor), the unpruned tree has graphs of its own, and every output is plain decoding's (float32)."""
    runtime = load_runtime(trained["export"], RuntimeConfig(device="cuda", dtype="float32", max_len=256, **SHAPE))
    engine = runtime.engine
    assert engine.use_graphs
    prompt = runtime.encode_chat(CHAT_PROMPTS[0])
    plain = engine.decode_plain(prompt, 24, runtime.eos_ids).tokens
    scorer, verified = engine.tree_scorer, {}
    for beta in (0.0, 0.5, 1.0, 0.5):
        scorer.threshold = beta
        result = engine.generate(prompt, 24, runtime.eos_ids)
        assert result.tokens == plain, beta
        verified[beta] = sum(result.drafted) / len(result.drafted)
    engine.set_tree_scorer(None)
    unpruned = engine.generate(prompt, 24, runtime.eos_ids)
    assert unpruned.tokens == plain and set(unpruned.drafted) == {SHAPE["budget"] - 1}
    assert verified[0.0] == SHAPE["budget"] - 1 > verified[0.5] >= verified[1.0] == 0
    chain = load_runtime(trained["export"], RuntimeConfig(device="cuda", dtype="float32", max_len=256, chain=True,
                                                          depth=4, prune_threshold=0.5))
    result = chain.engine.generate(prompt, 24, chain.eos_ids)
    assert result.tokens == plain and max(result.drafted) <= 4


@pytest.mark.parametrize("settings, named", [
    ({"trace_budget": 1}, "method.trace_budget must be 0 (the whole expansion) or 2..7"),
    ({"trace_budget": 8}, "2..7 (the candidates of trees of trace_depth 2 and trace_topk 2), got 8"),
    ({"trace_budget": -3}, "got -3"), ({"best_by": "loss"}, "method.best_by must be one of recall, auc, got 'loss'")])
def test_trace_settings_out_of_range_are_one_line_naming_the_key(settings, named):
    with pytest.raises(SpecdraftError, match=named.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        C2TConfig(draft="x", trace_depth=2, trace_topk=2, **settings)


def test_extended_features_prune_to_the_same_output_and_old_traces_are_one_line(trained, extended):
    config = json.loads((extended["export"] / "config.json").read_text())
    assert config["features"][3:] == ["probability", "parent_joint_probability", "rank"]
    classifier = load_draft(extended["export"]).draft
    assert classifier.hidden.in_features == 6
    pruned, tau, same = _decode(extended["export"], CHAT_PROMPTS[:2] + ["an unseen question?"], **SHAPE)
    assert same and pruned < SHAPE["budget"] - 1 and tau > 1.0
    old_rows = {"features": torch.rand(4, 3), "labels": torch.tensor([0.0, 1.0, 0.0, 0.0]), "drafts": [],
                "draft_digests": []}  # traces recorded with the paper's three features alone
    with pytest.raises(SpecdraftError, match="hold 3 features of a candidate; method.features=extended reads 6"):
        c2t_loss(classifier, old_rows, C2TConfig(draft="x", features="extended"))


def test_the_best_snapshot_is_picked_by_recall_or_by_auc():
    classifier = C2TClassifier(C2TConfig(draft="x"), DraftContext(target=None))
    generator = torch.Generator().manual_seed(0)
    batch = {"features": torch.rand(64, 3, generator=generator), "drafts": [], "draft_digests": [],
             "labels": (torch.rand(64, generator=generator) > 0.8).float()}
    for best_by in ("recall", "auc"):
        metrics = c2t_loss(classifier, batch, C2TConfig(draft="x", best_by=best_by)).metrics
        expected = metrics["auc"] if best_by == "auc" else metrics["recall"] - 1e-3 * metrics["positive_rate"]
        torch.testing.assert_close(metrics["best_by"], expected)
