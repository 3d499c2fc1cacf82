"""On-policy judge mining (`method.mine_judge`) on a tiny random target beside a tiny EAGLE-3 draft (CPU, float32):
the base runs accept by a judge export, every mismatch (the judge's accepted ones too) is branched twice, the control
(the target's own token) deciding whether the candidate's verdict labels it; a judge that never accepts mines exactly
what exact mining does; a failed control labels nothing and a crashing check is an error, never a positive; bad
settings and judges of another draft are one-line errors; the judge suite parses --rounds and --mine-threshold."""
import json
import shutil
import zlib

import pytest
import torch
from safetensors.torch import load_file, save_file

from specdraft import cli
from specdraft.core.errors import SpecdraftError
from specdraft.data import checks
from specdraft.data.sources import load_conversations
from specdraft.decoding.outputs import GenerationResult
from specdraft.methods import METHODS
from specdraft.methods.judge import JudgeConfig, mismatches
from specdraft.methods.judge.mining import RECORDS_SCHEMA, records_fingerprint
from specdraft.methods.judge.on_policy import judge_accepted
from specdraft.recipes import load_recipe, save_recipe
from specdraft.targets.generate import greedy_continuations
from tests.addons import judge_miner, mine_labels
from tests.test_judge import base, target  # noqa: F401  the same fixtures
from tools.bench import judge as suite

pytestmark = pytest.mark.reference_kernels

SPEC = METHODS["judge"]
MAX_NEW = 12
PROMPTS = [{"prompt": f"question {i}?", "check": "hashed", "answer": i} for i in range(6)]


def judge_export(directory, target_dir, draft):
    """A judge of `draft` with a random head, trained by no one, exported (hf) as training would."""
    run = directory / "run"
    run.mkdir(parents=True)
    recipe_file = directory / "source.yaml"
    recipe_file.write_text(f"target: {{path: {target_dir}}}\nmethod: {{name: judge, draft: {draft}}}\n"
                           f"train: {{output_dir: {run}}}\n")
    save_recipe(load_recipe(recipe_file), run)
    generator = torch.Generator().manual_seed(0)
    (run / "best").mkdir()
    save_file({"proj.weight": torch.randn(1, 64, generator=generator), "proj.bias": torch.zeros(1)},
              str(run / "best" / "draft.safetensors"))
    assert cli.main(["export", str(run), "--format", "hf", "--out", str(directory / "export")]) == 0
    return directory / "export"


@pytest.fixture(scope="module")
def judge(tmp_path_factory, tiny_target_dir, base):
    return judge_export(tmp_path_factory.mktemp("judge"), tiny_target_dir, base)


def hashed(check, answer):
    """Passes two answers in three, by a hash of their text: the same verdict whatever the order of the calls."""
    return zlib.crc32(answer.encode()) % 3 != 0


def miner_of(target, base, **settings):
    return judge_miner(target, base, MAX_NEW, **settings)


def mine(tmp_path, target, base, records, **settings):
    return mine_labels(tmp_path, target, base, records, MAX_NEW, **settings)


def test_judge_accepted_reads_the_target_s_own_choice_from_the_trace():
    judged = {"tokens": [5, 6, 42, 13], "parents": [-1, 0, 1, 2], "valid": [True] * 4,
              "draft_logprobs": [0.0, -0.1, -0.2, -0.3], "accepted_nodes": [0, 1, 2],
              "target_next": [6, 40, 13, 9]}  # node 1 the target's own, node 2 (42 for 40) the judge's
    exact = {"tokens": [13, 7], "parents": [-1, 0], "valid": [True] * 2, "draft_logprobs": [0.0, -0.1],
             "accepted_nodes": [0, 1], "target_next": [7, 3]}
    result = GenerationResult(tokens=[5, 6, 42, 13, 7, 3], trace=[judged, exact])
    assert judge_accepted(result) == [(2, 42, 40)]
    assert judge_accepted(GenerationResult(tokens=[5, 6], trace=[judged])) == []  # past the answer's end


def test_a_judge_that_never_accepts_mines_exactly_what_exact_mining_does(tmp_path, monkeypatch, target, base, judge):
    monkeypatch.setitem(checks.CHECKS, "hashed", hashed)
    _, exact, exact_problems = mine(tmp_path, target, base, PROMPTS)
    _, never, never_problems = mine(tmp_path, target, base, PROMPTS, mine_judge=str(judge), mine_threshold=1.0)
    assert never_problems == exact_problems and exact and any(row["labels"] for row in exact)
    for ours, theirs in zip(never, exact):
        assert ours["unrecoverable"] == theirs["unrecoverable"] == 0  # the control is the target's own answer
        for column in ("index", "positions", "draft_tokens", "target_tokens", "labels", "check_errors", "cycles"):
            assert ours[column] == theirs[column], column
        torch.testing.assert_close(torch.tensor(ours["hidden"]), torch.tensor(theirs["hidden"]))


def test_on_policy_mining_labels_judged_states_and_counts_unrecoverable(tmp_path, monkeypatch, target, base, judge):
    monkeypatch.setitem(checks.CHECKS, "hashed", hashed)
    miner, rows, _ = mine(tmp_path, target, base, PROMPTS, mine_judge=str(judge), mine_threshold=0.0)
    assert miner.engine.judge.threshold == 0.0 and rows
    conversations = {conversation.index: conversation for conversation in load_conversations(
        [str(tmp_path / "prompts.jsonl")])}
    accepted_by_judge = unrecoverable = 0
    for row in rows:
        prompt = miner.prompt_ids(conversations[row["index"]])
        result = miner.engine.generate(prompt, MAX_NEW, miner.eos_ids, trace=True)
        judged = judge_accepted(result)
        found = sorted(judged + [(t, token, result.tokens[t]) for t, token in mismatches(result)])
        accepted_by_judge += len(judged)
        unrecoverable += row["unrecoverable"]
        assert len(row["labels"]) + row["check_errors"] + row["unrecoverable"] == len(found)
        assert row["check_errors"] == 0
        expected = [verdicts(miner, prompt, result.tokens[:t], token, own) for t, token, own in found]
        labelled = [(t, token, own, label) for (t, token, own), (control, label) in zip(found, expected) if control]
        assert row["positions"] == [t for t, *_ in labelled] and row["labels"] == [label for *_, label in labelled]
        assert row["draft_tokens"] == [token for _, token, *_ in labelled]
        assert row["target_tokens"] == [own for _, _, own, _ in labelled]
        assert row["unrecoverable"] == sum(not control for control, _ in expected)
    assert accepted_by_judge > 0 and unrecoverable > 0 and any(row["labels"] for row in rows)


def verdicts(miner, prompt, before, token, own):
    """(the control's verdict, the candidate's) of one mismatch: each token, then the target's greedy answer."""
    def verdict(first):
        room = MAX_NEW - len(before) - 1 if first not in miner.eos_ids else 0
        continued = greedy_continuations(miner.target.model, [prompt + before + [first]], max(room, 1), miner.eos_ids,
                                         miner.target.tokenizer.pad_token_id)[0][:room]
        text = miner.target.tokenizer.decode(before + [first] + continued, skip_special_tokens=True)
        return int(hashed(None, text))

    return verdict(own), verdict(token)


def first_then(outcome, own_answer_passes: bool):
    """A check that passes the target's own answer (its first call; again later where `own_answer_passes`) and
    answers every other `outcome` (or raises it)."""
    calls = []

    def check(check, answer):
        calls.append(answer)
        if len(calls) == 1 or (own_answer_passes and answer == calls[0]):
            return True
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    return check


def test_a_failed_control_labels_nothing(tmp_path, monkeypatch, target, base, judge):
    monkeypatch.setitem(checks.CHECKS, "lost", first_then(False, own_answer_passes=False))
    miner, rows, _ = mine(tmp_path, target, base, [{"prompt": "question?", "check": "lost"}], mine_judge=str(judge),
                          mine_threshold=0.0)
    row = rows[0]
    prompt = miner.prompt_ids(load_conversations([str(tmp_path / "prompts.jsonl")])[0])
    result = miner.engine.generate(prompt, MAX_NEW, miner.eos_ids, trace=True)
    assert row["labels"] == [] and len(row["hidden"]) == 0 and row["check_errors"] == 0
    found = judge_accepted(result) + mismatches(result)
    assert row["unrecoverable"] == len(found) > 0  # every control's answer failed: nothing was recoverable


def test_a_crashing_check_is_an_error_never_a_positive(tmp_path, monkeypatch, target, base, judge):
    """At δ = 1 every control is the target's own answer (it passes); every candidate's check crashes."""
    fragile = first_then(RuntimeError("a bug in the checker"), own_answer_passes=True)
    monkeypatch.setitem(checks.CHECKS, "fragile", fragile)
    _, rows, _ = mine(tmp_path, target, base, [{"prompt": "question?", "check": "fragile"}], mine_judge=str(judge),
                      mine_threshold=1.0)
    row = rows[0]
    assert row["labels"] == [] and row["unrecoverable"] == 0 and row["check_errors"] > 0


def test_the_fingerprint_refuses_older_shards_and_tells_the_rounds_apart():
    exact = records_fingerprint(JudgeConfig(draft="d", mine_threshold=0.5))
    assert exact == {"draft": "d", "schema": RECORDS_SCHEMA} and RECORDS_SCHEMA > 1  # shards without `unrecoverable`
    judged = records_fingerprint(JudgeConfig(draft="d", mine_judge="j", mine_threshold=0.5))
    assert judged == {**exact, "mine_judge": "j", "mine_threshold": 0.5}


@pytest.mark.parametrize("settings, message", [
    ({"mine_threshold": 1.5}, "method.mine_threshold must be in [0, 1], got 1.5"),
    ({"mine_threshold": -0.1}, "method.mine_threshold must be in [0, 1], got -0.1"),
    ({"mine_judge": " "}, "method.mine_judge must name a judge export or run directory, got ' '"),
])
def test_bad_mining_settings_are_one_line_errors(settings, message):
    with pytest.raises(SpecdraftError) as err:
        JudgeConfig(draft="unused", **settings)
    assert str(err.value) == message


def test_a_mining_judge_of_another_draft_or_target_or_none_is_a_one_line_error(tmp_path, target, base, judge,
                                                                               tiny_target_dir):
    other_draft = copy_tree(base, tmp_path / "other")  # the base with one weight changed: another draft
    weights = load_file(str(base / "model.safetensors"))
    name = sorted(weights)[0]
    weights[name] = weights[name] + 1.0
    save_file(weights, str(other_draft / "model.safetensors"))
    judge_of_other = judge_export(tmp_path / "judge", tiny_target_dir, other_draft)
    other_target = copy_tree(judge, tmp_path / "other_target")  # its export says: a target of one more layer
    config = json.loads((other_target / "config.json").read_text())
    config["specdraft"]["target_info"]["num_layers"] += 1
    (other_target / "config.json").write_text(json.dumps(config))
    cases = [(judge_of_other, "was made for another draft than method.draft="),
             (other_target, "was made for another target"),
             (base, "holds a eagle3 draft, not a judge"),
             (tmp_path / "missing", "does not exist")]
    for path, message in cases:
        with pytest.raises(SpecdraftError) as err:
            miner_of(target, base, mine_judge=str(path))
        assert str(err.value).startswith(f"method.mine_judge={path}") and message in str(err.value)
        assert "\n" not in str(err.value)


def copy_tree(source, destination):
    shutil.copytree(source, destination)
    return destination


def test_the_suite_parses_rounds_and_the_mining_threshold(tmp_path):
    default = suite._args([str(tmp_path)])
    assert default.rounds == 1 and default.mine_threshold == 0.9
    args = suite._args([str(tmp_path), "--rounds", "2", "--mine-threshold", "0.8", "train.max_steps=3"])
    assert args.rounds == 2 and args.mine_threshold == 0.8 and args.overrides == ["train.max_steps=3"]
    for bad in (["--rounds", "0"], ["--mine-threshold", "1.5"]):
        with pytest.raises(SystemExit):
            suite._args([str(tmp_path), *bad])


def test_a_later_round_mines_with_the_previous_round_s_judge_on_every_label_so_far(tmp_path):
    args = suite._args([str(tmp_path / "draft"), "--rounds", "3", "--mine-threshold", "0.8", "a=1"])
    work = tmp_path / "work"
    first, third = suite.round_overrides(args, work, 1), suite.round_overrides(args, work, 3)
    assert not any(override.startswith(("method.mine_judge", "train.extra_distilled")) for override in first)
    assert f"distill.output_dir={work / 'labels'}" in first and "a=1" in first
    assert f"distill.output_dir={work / 'round3' / 'labels'}" in third
    assert f"method.mine_judge={work / 'round2' / 'export'}" in third and "method.mine_threshold=0.8" in third
    assert f"train.extra_distilled=[{work / 'labels'},{work / 'round2' / 'labels'}]" in third
