"""train.prefetch_features (specdraft.train.prefetch): a step takes prefetched features only when they are its own
batch's, the batch's number survives Lightning's transfer to the device, a fit with prefetching ends with the weights
of one without it (text and vision-language targets, under gradient accumulation too, and resumed) and uses the
prefetched features in every step but the first, and the setting resolves with one-line errors naming the key. CPU:
the prefetch is computed synchronously through the same path; the side stream is `gpu`."""
import csv

import lightning as L
import pytest
import torch

from specdraft.core.errors import SpecdraftError
from specdraft.core.types import TargetFeatures
from specdraft.train.prefetch import SEQ_KEY, FeaturePrefetch, PrefetchNeeds, pop_seq, prefetch_enabled


class CountingFeatures:
    """A feature source whose hidden state 0 [B, T, 1] is the batch's token ids; counts its calls."""

    def __init__(self):
        self.calls = 0

    def __call__(self, batch):
        self.calls += 1
        ids = batch["input_ids"].float()[..., None]  # [B, T, 1]
        return TargetFeatures(hidden_states={0: ids}, final_hidden=ids * 2, lm_head=torch.ones(4, 1))


def batches(count, start=0):
    return [{"input_ids": torch.full((2, 3), start + n), "images": [["a.png"], []]} for n in range(count)]


def run_steps(prefetch, loader, transfer=lambda batch: batch):
    """What the module does with each batch: its number popped, the prefetched features taken, the next batch's
    started after the backward -> [(batch number, features taken or None)]."""
    steps = []
    for batch in prefetch.track(loader):
        seq = pop_seq(transfer(batch))
        steps.append((seq, prefetch.take(seq)))
        prefetch.mark_gradient()  # as the module's post-accumulate-grad hook does in the backward
        prefetch.after_backward(seq)
    return steps


def recorded_prefetches(monkeypatch) -> list:
    """The FeaturePrefetch objects the training module makes from here on, in order."""
    from specdraft.train import module

    made = []

    def recording_prefetch(*args, **kwargs):
        made.append(FeaturePrefetch(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(module, "FeaturePrefetch", recording_prefetch)
    return made


def test_each_step_takes_its_own_batch_s_features_and_the_last_has_no_successor():
    source = CountingFeatures()
    prefetch = FeaturePrefetch(source, "cpu")
    steps = run_steps(prefetch, batches(4))
    assert [seq for seq, _ in steps] == [0, 1, 2, 3]
    assert steps[0][1] is None  # the first batch: nothing before it
    for seq, features in steps[1:]:
        assert torch.equal(features.hidden_states[0], torch.full((2, 3, 1), float(seq)))
    assert prefetch.taken == 3 and source.calls == 3  # the last batch's backward found no batch after it
    assert prefetch.held is None and not prefetch.handed_out


def test_features_of_another_batch_are_never_returned():
    prefetch = FeaturePrefetch(CountingFeatures(), "cpu")
    stream = prefetch.track(batches(3))
    first = next(stream)
    assert first[SEQ_KEY] == 0 and set(prefetch.handed_out) == {1}  # read one ahead
    prefetch.after_backward(0)
    assert prefetch.take(2) is None and prefetch.held is None  # batch 1's features: dropped, not handed to 2
    assert prefetch.take(None) is None  # an unnumbered batch (validation) takes nothing
    prefetch.after_backward(5)  # no batch 6 read: nothing started
    assert prefetch.held is None and prefetch.taken == 0


def test_a_fetcher_that_reads_one_batch_ahead_as_well_still_finds_the_next_batch():
    """Lightning's fetcher reads one ahead for a loader without a length: batch n + 1 is out before step n runs."""
    prefetch = FeaturePrefetch(CountingFeatures(), "cpu")
    stream = prefetch.track(batches(4))
    fetched, taken = [next(stream)], []
    for _ in range(4):
        fetched.append(next(stream, None))
        seq = pop_seq(fetched.pop(0))
        taken.append(prefetch.take(seq) is not None)
        prefetch.after_backward(seq)
        assert len(prefetch.handed_out) <= 2
    assert taken == [False, True, True, True]


def test_numbers_run_on_across_the_loader_s_iterators():
    """A new iterator (a new epoch) never reuses a number, so stale features cannot match a new batch."""
    prefetch = FeaturePrefetch(CountingFeatures(), "cpu")
    first = run_steps(prefetch, batches(2))
    second = run_steps(prefetch, batches(2, start=10))
    assert [seq for seq, _ in first + second] == [0, 1, 2, 3]
    assert second[0][1] is None and torch.equal(second[1][1].hidden_states[0], torch.full((2, 3, 1), 11.0))


def test_the_number_survives_lightning_s_transfer_to_the_device():
    module = L.LightningModule()
    prefetch = FeaturePrefetch(CountingFeatures(), "cpu")
    moved = []

    def transfer(batch):
        moved.append(module.transfer_batch_to_device(batch, torch.device("meta"), 0))  # as Lightning moves batches
        return moved[-1]

    steps = run_steps(prefetch, batches(3), transfer)
    assert [seq for seq, _ in steps] == [0, 1, 2] and prefetch.taken == 2
    assert moved[0]["input_ids"].device.type == "meta" and SEQ_KEY not in moved[0]  # popped: no loss sees it


def test_a_host_batch_is_left_as_the_loader_collated_it():
    loader = batches(2)
    prefetch = FeaturePrefetch(CountingFeatures(), "cpu")
    run_steps(prefetch, loader)
    assert all(SEQ_KEY not in batch for batch in loader)


NEEDS = dict(cuda=True, features_prefetchable=True, eager_step=True)


@pytest.mark.parametrize("change, unmet", [
    ({}, None), ({"features_prefetchable": False}, "online features of a target held whole on each GPU"),
    ({"eager_step": False}, "a step outside CUDA graphs")])
def test_settings_resolve_auto_quietly_and_true_with_an_error_naming_the_key(change, unmet):
    needs = PrefetchNeeds(**{**NEEDS, **change})
    assert prefetch_enabled("auto", needs) is (unmet is None)
    assert prefetch_enabled("false", needs) is False
    if unmet is None:
        assert prefetch_enabled("true", needs) is True
        return
    with pytest.raises(SpecdraftError) as err:
        prefetch_enabled("true", needs)
    assert str(err.value).startswith(f"train.prefetch_features=true needs {unmet}")
    assert str(err.value).endswith("set train.prefetch_features=auto or false") and "\n" not in str(err.value)


def test_auto_needs_a_cuda_device_and_true_runs_on_a_cpu():
    needs = PrefetchNeeds(**{**NEEDS, "cuda": False})
    assert prefetch_enabled("auto", needs) is False and prefetch_enabled("true", needs) is True


def test_feature_sources_declare_whether_they_may_run_ahead():
    from specdraft.train.features import (HybridFeatures, OfflineFeatures, OnlineFeatures, ShardedOnlineFeatures,
                                          VisionOnlineFeatures)

    assert OnlineFeatures.prefetchable and VisionOnlineFeatures.prefetchable
    assert not (ShardedOnlineFeatures.prefetchable or OfflineFeatures.prefetchable or HybridFeatures.prefetchable)


def logged_losses(run_dir):
    """train/loss of every logged step, from the run's CSV metrics."""
    rows = list(csv.DictReader(next(run_dir.glob("logs/*/metrics.csv")).open()))
    return [float(row["train/loss"]) for row in rows if row.get("train/loss")]


def _recipe(tmp_path, target_dir, distill_dir, method, prefetch, accumulate, start="backward"):
    method_yaml = "{name: vispec, ttt_steps: 3, draft_vocab_size: 256, num_queries: 3}" if method == "vispec" \
        else "{name: eagle3, ttt_steps: 3, draft_vocab_size: 256}"
    path = tmp_path / "recipe.yaml"
    path.write_text(f"""
target: {{path: {target_dir}, dtype: float32}}
method: {method_yaml}
data: {{val_fraction: 0.2, max_length: 256}}
distill: {{output_dir: {distill_dir}}}
train: {{output_dir: {tmp_path / 'run'}, max_steps: 5, micro_batch_size: 2, accumulate_grad_batches: {accumulate},
         val_every_steps: 2, lr: 3.0e-3, warmup_steps: 1, log_every_steps: 1, prefetch_features: {prefetch},
         prefetch_start: {start}}}
""")
    return path


@pytest.mark.parametrize("method, accumulate, start", [("eagle3", 1, "backward"), ("eagle3", 2, "backward"),
                                                       ("vispec", 1, "backward"), ("eagle3", 2, "gradients")])
def test_a_fit_with_prefetched_features_ends_with_the_weights_of_one_without(tmp_path, request, monkeypatch,
                                                                           method, accumulate, start):
    """Validations every 2 steps (and at the last, 5) fall between a prefetch and the step that takes it; with
    train.prefetch_start=gradients every micro-batch's backward marks its first complete gradient once."""
    from safetensors.torch import load_file

    from specdraft.drafts import SNAPSHOT_FILE
    from specdraft.recipes import load_recipe
    from specdraft.train.trainer import run_train

    target_dir, distill_dir = (request.getfixturevalue("tiny_vlm_dir"), request.getfixturevalue("distilled_images")) \
        if method == "vispec" else (request.getfixturevalue("tiny_target_dir"), request.getfixturevalue("distilled"))
    made = recorded_prefetches(monkeypatch)
    runs = {}
    for prefetch in ("false", "true"):
        out = tmp_path / prefetch
        out.mkdir()
        run_train(load_recipe(_recipe(out, target_dir, distill_dir, method, prefetch, accumulate, start)))
        runs[prefetch] = (load_file(str(out / "run" / "last" / SNAPSHOT_FILE)), logged_losses(out / "run"))
    assert len(made) == 1  # false makes none
    assert made[0].taken == 5 * accumulate - 1  # every micro-batch but the first took its prefetched features
    assert made[0].gradient_marks == (5 * accumulate if start == "gradients" else 0)
    (eager, eager_losses), (prefetched, losses) = runs["false"], runs["true"]
    assert len(losses) >= 5 and losses == eager_losses
    assert eager.keys() == prefetched.keys()
    for name in eager:
        torch.testing.assert_close(prefetched[name], eager[name], rtol=0, atol=0)


def test_true_without_a_feature_source_that_runs_ahead_is_an_error_before_training():
    """A method trained on its own records (no feature source), or a shard_target=auto that partitioned the target:
    what the recipe alone cannot tell."""
    from specdraft.config import TrainConfig
    from specdraft.core.types import DraftContext, TargetInfo
    from specdraft.methods import get_method
    from specdraft.testing.tiny import tiny_llama_config
    from specdraft.train.features import ShardedOnlineFeatures
    from specdraft.train.module import DraftModule

    spec, ctx = get_method("eagle3"), DraftContext(TargetInfo.from_hf_config(tiny_llama_config(), "tiny"))
    module = DraftModule(spec, spec.config(), TrainConfig(prefetch_features="true"), ctx, None)
    with pytest.raises(SpecdraftError, match="^train.prefetch_features=true needs online features"):
        module.batch_stream(torch.device("cpu"))
    sharded = DraftModule(spec, spec.config(), TrainConfig(prefetch_features="true"), ctx,
                          ShardedOnlineFeatures(lambda: None, [1]))
    with pytest.raises(SpecdraftError, match="not train.shard_target's partitioned target"):
        sharded.batch_stream(torch.device("cpu"))
    assert DraftModule(spec, spec.config(), TrainConfig(), ctx, None).batch_stream(torch.device("cpu")) is None


def test_the_first_complete_gradient_of_a_step_is_marked_once():
    prefetch = FeaturePrefetch(CountingFeatures(), "cpu", start="gradients")
    for _ in range(3):
        prefetch.mark_gradient()
    assert prefetch.gradient_marks == 1
    prefetch.after_backward(0)  # the step's end: the next step marks again
    prefetch.mark_gradient()
    assert prefetch.gradient_marks == 2
    backward = FeaturePrefetch(CountingFeatures(), "cpu")
    backward.mark_gradient()
    assert backward.gradient_marks == 0


@pytest.mark.gpu
@pytest.mark.parametrize("start", ["backward", "gradients"])
def test_on_cuda_the_features_come_from_the_side_stream_and_the_step_waits_for_them(start):
    source = CountingFeatures()
    prefetch = FeaturePrefetch(source, "cuda", start=start)
    pinned = [{name: value.pin_memory() if isinstance(value, torch.Tensor) else value for name, value in b.items()}
              for b in batches(3)]
    steps = run_steps(prefetch, pinned, lambda batch: {**batch, "input_ids": batch["input_ids"].cuda()})
    assert prefetch.stream is not None and prefetch.taken == 2
    for seq, features in steps[1:]:
        assert torch.equal(features.hidden_states[0].cpu(), torch.full((2, 3, 1), float(seq)))


def test_a_resumed_run_with_prefetched_features_ends_with_the_uninterrupted_run_s_weights(tmp_path, tiny_target_dir,
                                                                                        distilled, monkeypatch):
    """Stopped after step 2 (its checkpoint) and resumed: the resumed fit's first step computes its own features
    (nothing was prefetched for it in this process), the next takes the prefetched ones."""
    from lightning.pytorch.callbacks import Callback
    from safetensors.torch import load_file

    from specdraft.drafts import SNAPSHOT_FILE
    from specdraft.recipes import load_recipe
    from specdraft.train.trainer import run_train

    class StopAtStep2(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            trainer.should_stop = trainer.should_stop or trainer.global_step == 2

    made = recorded_prefetches(monkeypatch)
    weights = {}
    for name in ("whole", "resumed"):
        out = tmp_path / name
        out.mkdir()
        recipe = load_recipe(_recipe(out, tiny_target_dir, distilled, "eagle3", "true", 1),
                             ["train.max_steps=4", "train.resume=auto"])
        run_train(recipe, extra_callbacks=[StopAtStep2()] if name == "resumed" else [])
        if name == "resumed":
            run_train(recipe)
        weights[name] = load_file(str(out / "run" / "last" / SNAPSHOT_FILE))
    assert [prefetch.taken for prefetch in made] == [3, 1, 1]
    for name in weights["whole"]:
        torch.testing.assert_close(weights["resumed"][name], weights["whole"][name], rtol=0, atol=0)
