"""Judge decoding on a tiny random target beside a tiny EAGLE-3 draft (CPU, float32): mining labels every mismatch
(the draft's token, the target's greedy continuation, the check) and counts every prompt; a check that crashes or
times out labels nothing and is an error, never a positive; supplied labels are read; δ = 1 gives exactly the
lossless output and δ = 0 accepts every drafted depth, in trees and chains; a judge refuses T > 0; bench sweeps δ
with answers checked and says `lossless: false`."""
import json

import pytest
import torch
from safetensors.torch import save_file

from specdraft import cli
from specdraft.config import RuntimeConfig, TargetConfig
from specdraft.core.errors import SpecdraftError
from specdraft.core.types import DraftContext
from specdraft.data import checks
from specdraft.data.sandbox import run_python
from specdraft.data.sources import load_conversations
from specdraft.decoding.accept import draft_choices, verify_judged
from specdraft.decoding.engine import SpecEngine
from specdraft.decoding.outputs import GenerationResult
from specdraft.decoding.verifier import from_hf, hf_rope_tables
from specdraft.decoding.tree import DraftTree, TreeShape
from specdraft.drafts import load_base
from specdraft.methods import METHODS
from specdraft.methods.judge import (JudgeConfig, JudgeHead, judge_collate, judge_loss, label_curve,
                                     mismatches, threshold_for_precision)
from specdraft.methods.judge.mining import Greedy, best_child, static_generator
from specdraft.recipes import load_recipe, save_recipe
from specdraft.runtime.bench import BenchSettings, format_table, run_bench
from specdraft.runtime.load import load_runtime, set_judge_threshold
from specdraft.targets import load_target
from specdraft.targets.generate import greedy_continuations
from specdraft.targets.load import eos_token_ids
from tests.addons import judge_miner, mine_labels, train_base_export, write_prompts

pytestmark = pytest.mark.reference_kernels

SPEC = METHODS["judge"]
MAX_NEW = 12


@pytest.fixture(scope="module")
def base(tmp_path_factory, tiny_target_dir, distilled):
    return train_base_export(tmp_path_factory.mktemp("base"), tiny_target_dir, distilled)


@pytest.fixture(scope="module")
def target(tiny_target_dir):
    return load_target(TargetConfig(path=str(tiny_target_dir)))


def _miner(target, base, **settings):
    return judge_miner(target, base, MAX_NEW, **settings)


def _mine(tmp_path, target, base, records, **settings):
    return mine_labels(tmp_path, target, base, records, MAX_NEW, **settings)


def _always(check, answer):
    return True


def test_mismatches_are_the_draft_s_best_unaccepted_child_within_the_answer():
    cycle = {"tokens": [5, 6, 42, 13, 77, 88], "parents": [-1, 0, 0, 1, 1, 1],
             "valid": [True, True, True, True, True, False], "draft_logprobs": [0.0, -0.1, -2.0, -0.5, None, -0.01],
             "accepted_nodes": [0, 1]}  # 6 accepted; node 3 beats node 4 (pruned) and node 5 (padding)
    leaf = {"tokens": [7, 8, 9], "parents": [-1, 0, 1], "valid": [True] * 3, "draft_logprobs": [0.0, -0.1, -0.2],
            "accepted_nodes": [0, 1, 2]}  # everything accepted: no child left to mismatch
    result = GenerationResult(tokens=[5, 6, 7, 8, 9, 10], trace=[cycle, leaf])
    assert mismatches(result) == [(2, 13)]
    assert mismatches(GenerationResult(tokens=[5, 6], trace=[cycle])) == []  # past the answer's end


def test_mining_labels_every_mismatch_with_the_state_the_judge_reads(tmp_path, monkeypatch, target, base):
    monkeypatch.setitem(checks.CHECKS, "always", _always)
    records = [{"prompt": f"question {i}?", "check": "always"} for i in range(3)]
    miner, rows, problems = _mine(tmp_path, target, base, records)
    assert problems == [] and [row["index"] for row in rows] == [0, 1, 2]
    runtime = load_runtime(base, RuntimeConfig(device="cpu", dtype="float32"))  # the miner's shape: the default tree
    hidden_size = target.info.hidden_size
    for record, row in zip(records, rows):
        prompt = runtime.encode_chat(record["prompt"])
        result = runtime.engine.generate(prompt, MAX_NEW, runtime.eos_ids, trace=True)
        expected = mismatches(result)
        assert expected and row["positions"] == [t for t, _ in expected]
        assert row["draft_tokens"] == [d for _, d in expected]
        assert row["target_tokens"] == [result.tokens[t] for t, _ in expected]
        assert row["labels"] == [1] * len(expected) and row["check_errors"] == 0
        assert len(row["hidden"]) == len(expected) * hidden_size
        t, token = expected[0]
        state = _final_state(target.model, prompt + result.tokens[:t] + [token])
        torch.testing.assert_close(torch.tensor(row["hidden"][:hidden_size]).float(), state, atol=2e-2, rtol=2e-3)


def _final_state(model, ids):
    """The target's last-layer state before its final norm at the last of `ids`."""
    kept = []
    handle = model.get_decoder().norm.register_forward_pre_hook(lambda module, args: kept.append(args[0]))
    with torch.no_grad():
        model(torch.tensor([ids]))
    handle.remove()
    return kept[0][0, -1].float()


def test_labels_are_the_check_s_verdict_on_each_branch(tmp_path, monkeypatch, target, base):
    seen = []

    def every_other(check, answer):  # the target's own answer passes; branches pass by the parity of their length
        seen.append(answer)
        return len(seen) == 1 or len(answer) % 2 == 0

    monkeypatch.setitem(checks.CHECKS, "parity", every_other)
    miner, rows, _ = _mine(tmp_path, target, base, [{"prompt": "question?", "check": "parity"}])
    row, reference = rows[0], seen[0]
    prompt = miner.prompt_ids(load_conversations([str(tmp_path / "prompts.jsonl")])[0])
    answer = miner.engine.generate(prompt, MAX_NEW, miner.eos_ids).tokens
    text = lambda tokens: target.tokenizer.decode(tokens, skip_special_tokens=True)  # noqa: E731
    assert text(answer) == reference and row["labels"]
    for t, token, label in zip(row["positions"], row["draft_tokens"], row["labels"]):
        room = MAX_NEW - t - 1 if token not in miner.eos_ids else 0
        continued = greedy_continuations(target.model, [prompt + answer[:t] + [token]], max(room, 1), miner.eos_ids,
                                         target.tokenizer.pad_token_id)[0][:room]
        branch = text(answer[:t] + [token] + continued)
        assert label == int(len(branch) % 2 == 0), (t, branch)


def test_a_check_that_crashes_or_times_out_labels_nothing_and_is_an_error(tmp_path, monkeypatch, target, base):
    calls = []

    def fragile(check, answer):  # passes the target's own answer, then crashes on every branch
        calls.append(answer)
        if len(calls) > 1:
            raise RuntimeError("a bug in the checker")
        return True

    def slow(check, answer):  # a checker whose sandboxed run never ends
        return run_python("while True:\n    pass\n", "", timeout_s=0.5)

    monkeypatch.setitem(checks.CHECKS, "fragile", fragile)
    monkeypatch.setitem(checks.CHECKS, "slow", slow)
    records = [{"prompt": "question?", "check": "fragile"}, {"prompt": "another?", "check": "slow"},
               {"prompt": "no check?"}, {"prompt": "wrong?", "check": "number", "answer": 123456789}]
    _, rows, problems = _mine(tmp_path, target, base, records)
    assert len(rows) == 1 and rows[0]["labels"] == [] and len(rows[0]["hidden"]) == 0
    assert rows[0]["check_errors"] == len(calls) - 1 > 0  # every branch's check failed: none labelled
    statuses = {problem["index"]: problem["status"] for problem in problems}
    assert statuses == {1: "error", 2: "skipped", 3: "skipped"}  # the time-out is an error, never a label


def test_supplied_labels_are_read_with_the_state_at_their_candidate(tmp_path, target, base):
    labels = [{"prefix": "ab", "candidate": "c", "label": 1}, {"prefix": "", "candidate_id": 65, "label": 0}]
    records = [{"prompt": "question?", "labels": labels},
               {"prompt": "bad", "labels": [{"prefix": "x", "candidate": "two tokens", "label": 1}]}]
    miner, rows, problems = _mine(tmp_path, target, base, records)
    assert [problem["index"] for problem in problems] == [1] and "not one; give candidate_id" in problems[0]["reason"]
    row = rows[0]
    assert row["origin"] == "supplied" and row["labels"] == [1, 0] and row["positions"] == [2, 0]
    prompt = miner.prompt_ids(load_conversations([str(tmp_path / "prompts.jsonl")])[0])
    c = target.tokenizer("c", add_special_tokens=False)["input_ids"]
    assert row["draft_tokens"] == [c[0], 65]
    ab = target.tokenizer("ab", add_special_tokens=False)["input_ids"]
    state = _final_state(target.model, prompt + ab + c)
    torch.testing.assert_close(torch.tensor(row["hidden"][:target.info.hidden_size]).float(), state, atol=2e-2,
                               rtol=2e-3)


def test_the_loss_balances_classes_and_logs_recall():
    cfg = JudgeConfig(draft="unused")
    head = JudgeHead(cfg, DraftContext(target=_info(8)))
    rows = [{"labels": [1, 1, 1], "hidden": torch.randn(24).tolist()}, {"labels": [], "hidden": []},
            {"labels": [0], "hidden": torch.randn(8).tolist()}]
    batch = judge_collate(rows)
    assert batch["hidden"].shape == (4, 8) and batch["labels"].tolist() == [1, 1, 1, 0]
    out = judge_loss(head, batch, cfg)  # zero head: every score 0.5
    torch.testing.assert_close(out.loss, torch.tensor(0.6931), atol=1e-4, rtol=0)
    assert out.metrics["recall"] == 0.0 and out.metrics["specificity"] == 1.0 and out.metrics["balanced_acc"] == 0.5
    empty = judge_loss(head, judge_collate([{"labels": [], "hidden": []}]), cfg)
    assert float(empty.loss.detach()) == 0.0 and empty.loss.requires_grad


def test_the_static_engine_continues_branches_as_generate_does(target):
    """The batched static engine (a GPU's default) and Hugging Face generate: the same continuations, and the same
    state at each prompt's last token, in float32."""
    eos = eos_token_ids(target.model, target.tokenizer)
    prompts = [target.tokenizer(text)["input_ids"] for text in ("question?", "a longer question here?", "q")]
    static = static_generator(target, "static", 2, 64, "cpu")
    assert static is not None and static_generator(target, "auto", 2, 64, "cpu") is None  # auto: static on a GPU
    hf_answers, hf_states = Greedy(target, eos, 2).continuations(prompts, 6)
    answers, states = Greedy(target, eos, 2, static).continuations(prompts, 6)
    assert answers == hf_answers and states.dtype == torch.float16 and states.shape == (3, target.info.hidden_size)
    torch.testing.assert_close(states.float(), hf_states.float(), atol=2e-2, rtol=2e-3)
    torch.testing.assert_close(states[1].float(), _final_state(target.model, prompts[1]), atol=2e-2, rtol=2e-3)


def test_unsolved_prompts_are_skipped_before_speculative_decoding(tmp_path, monkeypatch, target, base):
    monkeypatch.setitem(checks.CHECKS, "always", _always)
    miner, _ = _miner(target, base)
    decoded, generate = [], miner.engine.generate
    monkeypatch.setattr(miner.engine, "generate", lambda *args, **kw: decoded.append(1) or generate(*args, **kw))
    records = [{"prompt": "wrong?", "check": "number", "answer": 123456789}, {"prompt": "right?", "check": "always"}]
    prompts = write_prompts(tmp_path / "prompts.jsonl", records)
    rows, problems = miner.records(dict(enumerate(load_conversations([str(prompts)]))))
    assert [row["index"] for row in rows] == [1] and [problem["status"] for problem in problems] == ["skipped"]
    assert len(decoded) == 1  # the solved prompt alone


def test_the_label_curve_and_the_delta_for_a_precision_target():
    scores = torch.tensor([0.99, 0.95, 0.9, 0.8, 0.7, 0.6])
    labels = torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0, 0.0])
    high, low = label_curve(scores, labels, [0.92, 0.5])
    assert high == {"threshold": 0.92, "accepted": 2 / 6, "precision": 1.0, "recall": 0.5, "false_accepts": 0}
    assert low["precision"] == pytest.approx(4 / 6) and low["recall"] == 1.0 and low["false_accepts"] == 2
    assert label_curve(scores, labels, [0.999])[0]["precision"] is None
    assert threshold_for_precision(scores, labels, 1.0) == pytest.approx(0.9)  # the top two, then a negative
    assert threshold_for_precision(scores, labels, 0.8) == pytest.approx(0.6)  # four of the top five
    assert threshold_for_precision(scores, labels, 0.5) == 0.0  # every label
    assert threshold_for_precision(scores, 1 - labels, 0.9) == 1.0  # none: nothing beyond exact decoding
    tied = threshold_for_precision(torch.tensor([0.9, 0.9, 0.5]), torch.tensor([1.0, 0.0, 1.0]), 1.0)
    assert tied == 1.0  # a cut never splits a tie


def _info(hidden):
    from specdraft.core.types import TargetInfo

    return TargetInfo("tiny", "llama", hidden, 1, 1, 1, hidden, 2 * hidden, 16, 1e-5, 1e4, 64)


def _judged_engine(target, base, shape, threshold):
    cfg = JudgeConfig(draft=str(base))
    head = JudgeHead(cfg, DraftContext(target=target.info, base=load_base(SPEC, cfg, target.info)))
    torch.nn.init.normal_(head.proj.weight)  # scores spread over (0, 1)
    target_model = from_hf(target.model, target.info)
    drafter = SPEC.runtime(head, cfg, target_model)
    judge = None
    if threshold is not None:
        judge = drafter.node_judge()
        judge.threshold = threshold
    return SpecEngine(target_model, drafter, shape, 256, hf_rope_tables(target.model, 256), judge=judge)


@pytest.mark.parametrize("shape", [TreeShape.chain(4), TreeShape(depth=4, topk=3, budget=12)], ids=["chain", "tree"])
def test_delta_one_is_exactly_lossless_and_delta_zero_accepts_every_depth(target, base, shape):
    prompt = target.tokenizer("question?")["input_ids"]
    eos = eos_token_ids(target.model, target.tokenizer)
    exact = _judged_engine(target, base, shape, None)
    plain = exact.decode_plain(prompt, 24, eos)
    reference = exact.generate(prompt, 24, eos)
    never = _judged_engine(target, base, shape, 1.0).generate(prompt, 24, eos)
    assert never.tokens == reference.tokens == plain.tokens and never.accepted == reference.accepted
    everything = _judged_engine(target, base, shape, 0.0).generate(prompt, 24, eos, trace=True)
    assert everything.accepted == [_draft_path(row) for row in everything.trace]  # the draft's own path, each cycle
    assert any(length > 1 for length in everything.accepted)
    with pytest.raises(SpecdraftError, match="learned acceptance .* decodes greedily; got temperature 1") as err:
        _judged_engine(target, base, shape, 0.5).generate(prompt, 8, eos, temperature=1.0)
    assert "\n" not in str(err.value)


def _draft_path(row: dict) -> int:
    """How deep the path of the draft's own choices (each node's most probable child) goes in one cycle's tree."""
    depth, node = 0, best_child(row, 0)
    while node is not None:
        depth, node = depth + 1, best_child(row, node)
    return depth


def test_the_judge_decides_on_the_draft_s_own_choice_alone():
    """Root 0; its children 1 (the draft's choice) and 2; 3 under 1. Target argmax: 9 everywhere (no exact match)."""
    tree = DraftTree(tokens=torch.tensor([0, 5, 6, 7, 0]), parents=torch.tensor([-1, 0, 0, 1, -1]),
                     depths=torch.tensor([0, 1, 1, 2, 0]), valid=torch.tensor([True, True, True, True, False]),
                     tree_mask=torch.ones(5, 5, dtype=torch.bool),
                     joint_logprobs=torch.tensor([0.0, -0.5, -1.0, -0.9, 0.0]))
    assert draft_choices(tree).tolist() == [False, True, False, True, False]
    logits = torch.zeros(5, 10)
    logits[:, 9] = 1.0

    class Scores:
        threshold = 0.5

        def __init__(self, values):
            self.values = torch.tensor(values)

        def scores(self, hidden):
            return self.values

    hidden = torch.zeros(5, 4)
    nodes, length, _ = verify_judged(logits, hidden, tree, 2, Scores([0.0, 0.9, 0.99, 0.9, 1.0]))
    assert nodes.tolist() == [0, 1, 3] and length.item() == 2
    nodes, length, _ = verify_judged(logits, hidden, tree, 2, Scores([0.0, 0.1, 0.99, 0.9, 1.0]))
    assert nodes.tolist() == [0, -1, -1] and length.item() == 0  # the sibling scores high, but is not the draft's


@pytest.fixture(scope="module")
def judge_run(tmp_path_factory, tiny_target_dir, base):
    """A judge run directory (recipe and a random head), loadable like a trained one."""
    run = tmp_path_factory.mktemp("judge_run")
    recipe_file = run / "source.yaml"
    recipe_file.write_text(f"target: {{path: {tiny_target_dir}}}\nmethod: {{name: judge, draft: {base}}}\n"
                           f"train: {{output_dir: {run}}}\n")
    recipe = load_recipe(recipe_file)
    save_recipe(recipe, run)
    generator = torch.Generator().manual_seed(0)
    weights = {"proj.weight": torch.randn(1, 64, generator=generator), "proj.bias": torch.zeros(1)}
    (run / "best").mkdir()
    save_file(weights, str(run / "best" / "draft.safetensors"))
    return run


def test_bench_sweeps_delta_with_checked_answers_and_says_lossless_false(tmp_path, monkeypatch, judge_run):
    monkeypatch.setitem(checks.CHECKS, "always", _always)
    prompts = write_prompts(tmp_path / "checked.jsonl", [{"prompt": f"q{i}?", "check": "always"} for i in range(2)])
    runtime = load_runtime(judge_run, RuntimeConfig(device="cpu", dtype="float32", depth=3, chain=True, max_len=256))
    settings = BenchSettings(prompts=str(prompts), max_new_tokens=8, temperatures=(0.0,), hf_baseline=False,
                             lossless_prompts=2, judge_thresholds=(1.0, 0.0), check_answers=True)
    report = run_bench(runtime, settings, tmp_path / "out")
    exact, (never, everything) = report["runs"][0], report["judge_sweep"]
    assert exact["lossless"] is True and report["lossless_float32"] is True  # the exact rule's check
    assert never["lossless"] is False and never["lossless_prompts"] == 2 and never["tau"] == exact["tau"]
    assert everything["tau"] == 4.0 and everything["acceptance"] == "judged@0.0"
    assert everything["answers"]["retained_accuracy"] == 1.0 and everything["answers"]["checked_prompts"] == 2
    assert report["float32_check"]["identical"] == 2 and report["float32_matches_plain"] == "2/2"
    assert runtime.engine.judge is None
    saved = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert not any(run["lossless"] for run in saved["judge_sweep"]) and (tmp_path / "out" / "bench.png").is_file()
    assert "| judge δ=0 | 4.00 |" in format_table(report)
    set_judge_threshold(runtime, 0.5)
    assert runtime.engine.acceptance(0.0).key == "judged@0.5" and runtime.settings.judge_threshold == 0.5


def test_bench_cli_judges_only_a_draft_that_ships_a_judge(tmp_path, monkeypatch, judge_run, base, capsys):
    monkeypatch.setitem(checks.CHECKS, "always", _always)
    prompts = write_prompts(tmp_path / "checked.jsonl", [{"prompt": "q?", "check": "always"}])
    flags = ["--device", "cpu", "--dtype", "float32", "--prompts", str(prompts), "--max-new-tokens", "6",
             "--temperature", "0", "--no-hf", "--lossless-prompts", "1", "--depth", "3", "--topk", "2",
             "--budget", "6", "--max-len", "256", "--check-answers", "--judge-threshold", "0.9", "0.1"]
    assert cli.main(["bench", str(judge_run), *flags, "--out", str(tmp_path / "judged")]) == 0
    report = json.loads((tmp_path / "judged" / "bench.json").read_text())
    assert [run["judge_threshold"] for run in report["judge_sweep"]] == [0.9, 0.1]
    assert not any(run["lossless"] for run in report["judge_sweep"])  # judged runs are lossy by design
    assert cli.main(["bench", str(base), *flags, "--out", str(tmp_path / "exact")]) == 2
    assert "needs a draft that ships a judge" in capsys.readouterr().err
    unchecked = write_prompts(tmp_path / "plain.jsonl", [{"prompt": "no check here"}])
    assert cli.main(["bench", str(judge_run), *flags, "--prompts", str(unchecked), "--out", str(tmp_path / "x")]) == 2
    assert "has no answer check" in capsys.readouterr().err
