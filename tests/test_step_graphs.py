"""train.cuda_graphs (specdraft.train.graphs): the replayed step gives the eager step's loss, metrics and gradients,
under gradient accumulation too, keeps one graph per batch shape, falls back when a capture fails, and resolves
auto/true/false with errors naming the key. CPU: captures run through `rerun_capture` (the same buffers and
bookkeeping, the loss run again instead of a graph replayed); the real capture is `gpu`."""
import pytest
import torch

from specdraft.config import TrainConfig
from specdraft.core.errors import SpecdraftError
from specdraft.core.types import DraftBatch, DraftContext, LossOutput, TargetFeatures, TargetInfo
from specdraft.methods import get_method
from specdraft.testing.tiny import tiny_llama_config
from specdraft.train.graphs import GraphNeeds, StepGraphs, graphs_enabled, rerun_capture


def tiny_draft_and_loss(device="cpu", compiled=False):
    """A tiny EAGLE-3 draft (its layer's parts compiled or not) and `loss(batch)` on random target features fixed
    per batch shape."""
    spec = get_method("eagle3")
    info = TargetInfo.from_hf_config(tiny_llama_config(), "tiny")
    cfg = spec.config(ttt_steps=3, draft_vocab_size=64)
    torch.manual_seed(0)
    with torch.device(device):
        draft = spec.build(cfg, DraftContext(info, torch.arange(info.vocab_size), activation_checkpointing="swiglu",
                                             compile=compiled))
    layers = sorted({0, *spec.feature_layers(cfg, info)})
    lm_head = torch.randn(info.vocab_size, info.hidden_size, device=device) * 0.1
    fixed = {}  # per batch shape, made in an eager step (a capture copies nothing from the host)

    def loss(batch):
        ids = batch["input_ids"]
        if ids.shape not in fixed:
            generator = torch.Generator().manual_seed(int(ids.shape[1]))
            fixed[ids.shape] = {i: torch.randn(*ids.shape, info.hidden_size, generator=generator).to(device)
                                for i in layers}
        hidden = dict(fixed[ids.shape])
        hidden[0] = hidden[0] + ids[..., None].float() * 1e-3  # features that depend on the batch's tokens
        features = TargetFeatures(hidden_states=hidden, final_hidden=hidden[layers[-1]], lm_head=lm_head)
        return spec.loss(draft, DraftBatch(ids, batch["loss_mask"], batch["attention_mask"], features), cfg)
    return draft, loss


def batch_of(seq_len, seed, vocab=256):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (2, seq_len), generator=generator)
    return {"input_ids": ids, "loss_mask": torch.ones_like(ids), "attention_mask": torch.ones_like(ids),
            "position_ids": None}


def train(draft, loss_fn, batches, accumulate=1, autocast=False):
    """Per batch the loss (divided as Lightning divides it, under bf16 autocast with `autocast`) backward, the
    gradients accumulated over `accumulate` batches, then a plain SGD step -> (losses, metrics, the gradients
    after each accumulation)."""
    losses, metrics, grads = [], [], []
    for index, batch in enumerate(batches):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            result = loss_fn(batch)
        (result.loss / accumulate).backward()
        losses.append(result.loss.detach().clone())
        metrics.append({k: v.detach().clone() for k, v in result.metrics.items()})
        if (index + 1) % accumulate == 0:
            grads.append([p.grad.clone() for p in draft.parameters()])
            with torch.no_grad():
                for p in draft.parameters():
                    p.add_(p.grad, alpha=-0.1)  # the weights change between steps, as training's do
                    p.grad = None
    return losses, metrics, grads


@pytest.mark.parametrize("accumulate", [1, 2])
def test_replayed_steps_give_the_eager_loss_metrics_and_gradients(accumulate):
    batches = [batch_of(16, seed) for seed in range(6)]
    draft, loss_fn = tiny_draft_and_loss()
    eager = train(draft, loss_fn, batches, accumulate)
    draft, loss_fn = tiny_draft_and_loss()
    graphs = StepGraphs(loss_fn, list(draft.parameters()), warmup=2, capture=rerun_capture)
    replayed = train(draft, graphs, batches, accumulate)
    assert len(graphs.graphs) == 1 and graphs.failed is None
    for got, want in zip(replayed[0], eager[0]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for got, want in zip(replayed[1], eager[1]):
        assert got.keys() == want.keys()
        for name in want:
            torch.testing.assert_close(got[name], want[name].float(), rtol=1e-5, atol=1e-6)
    for got, want in zip(replayed[2], eager[2]):
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)


def test_one_graph_per_batch_shape_each_after_its_warmup():
    draft, loss_fn = tiny_draft_and_loss()
    graphs = StepGraphs(loss_fn, list(draft.parameters()), warmup=1, max_graphs=2, capture=rerun_capture)
    for seq_len in (16, 24, 16, 24, 32, 32, 32):
        graphs(batch_of(seq_len, seq_len)).loss.backward()
    assert sorted(key[1][0][1] for key in graphs.graphs) == [16, 24]  # 32 came after the cap: eager
    assert graphs.seen[next(key for key in graphs.seen if key[1][0][1] == 32)] == 3


def test_a_host_metric_falls_back_to_eager_steps_or_is_an_error_when_strict():
    draft, loss_fn = tiny_draft_and_loss()

    def with_host_metric(batch):
        result = loss_fn(batch)
        return LossOutput(result.loss, {**result.metrics, "rows": 2.0})

    graphs = StepGraphs(with_host_metric, list(draft.parameters()), warmup=0, capture=rerun_capture)
    result = graphs(batch_of(16, 0))
    assert graphs.failed and "host value" in graphs.failed and not graphs.graphs
    assert result.metrics["rows"] == 2.0 and result.loss.grad_fn is not None  # the eager step
    strict = StepGraphs(with_host_metric, list(draft.parameters()), warmup=0, strict=True, capture=rerun_capture)
    with pytest.raises(SpecdraftError, match="set train.cuda_graphs=false to train eagerly"):
        strict(batch_of(16, 0))


def test_a_batch_with_host_values_runs_eagerly():
    draft, loss_fn = tiny_draft_and_loss()
    graphs = StepGraphs(lambda batch: loss_fn(batch), list(draft.parameters()), warmup=0, capture=rerun_capture)
    graphs({**batch_of(16, 0), "images": [["a.png"], []]}).loss.backward()
    assert not graphs.graphs and not graphs.seen


NEEDS = dict(cuda=True, single_device=True, strategy="auto", checkpointing="swiglu", features_graph_safe=True,
             method_graph_safe=True)


@pytest.mark.parametrize("change, unmet", [
    ({}, None), ({"cuda": False}, "a CUDA device"), ({"single_device": False}, "one device"),
    ({"strategy": "deepspeed_stage_2"}, "no DeepSpeed strategy"),
    ({"checkpointing": "full"}, "train.activation_checkpointing in ['none', 'swiglu'] (got full)"),
    ({"features_graph_safe": False}, "data.features=online"), ({"method_graph_safe": False}, "a method whose loss"),
    ({"unpacked_rows": False}, "unpacked rows")])
def test_settings_resolve_auto_quietly_and_true_with_an_error_naming_the_key(change, unmet):
    needs = GraphNeeds(**{**NEEDS, **change})
    assert graphs_enabled("auto", needs) is (unmet is None)
    assert graphs_enabled("false", needs) is False
    if unmet is None:
        assert graphs_enabled("true", needs) is True
        return
    with pytest.raises(SpecdraftError, match=f"train.cuda_graphs=true needs {unmet[:20]}.*; set train.cuda_graphs"):
        graphs_enabled("true", needs)


def test_the_recipe_key_takes_auto_true_false_only():
    assert TrainConfig().cuda_graphs == "auto" and TrainConfig(cuda_graphs=False).cuda_graphs == "false"
    with pytest.raises(SpecdraftError, match="train.cuda_graphs"):
        TrainConfig(cuda_graphs="sometimes")


def test_trainer_steps_through_the_graphs_as_it_steps_eagerly(tmp_path, tiny_target_dir, distilled, monkeypatch):
    """`train` with the step's graphs (rerun here) ends with the eager run's weights: Lightning's zero_grad,
    backward, clipping and AdamW see the replayed gradients as they see computed ones."""
    from safetensors.torch import load_file

    from specdraft.drafts import SNAPSHOT_FILE

    from specdraft.recipes import load_recipe
    from specdraft.train import module
    from specdraft.train.trainer import run_train
    from tests.test_train_export_eval import make_recipe

    made = []

    def rerun_graphs(*args, **kwargs):
        made.append(StepGraphs(*args, capture=rerun_capture, **kwargs))
        return made[-1]

    def final_weights(name, graphs):
        with monkeypatch.context() as patch:
            if graphs:
                patch.setattr(module, "graphs_enabled", lambda setting, needs: True)
                patch.setattr(module, "StepGraphs", rerun_graphs)
            out = tmp_path / name
            out.mkdir()
            recipe = make_recipe(out, tiny_target_dir, distilled, max_steps=5, val_every_steps=5, warmup_steps=1,
                                 accumulate_grad_batches=1)
            run_train(load_recipe(recipe))
        return load_file(str(out / "run" / "last" / SNAPSHOT_FILE))

    eager, replayed = final_weights("eager", False), final_weights("graphs", True)
    assert len(made) == 1 and len(made[0].graphs) == 1 and made[0].failed is None  # steps 3 to 5 replayed
    assert eager.keys() == replayed.keys()
    for name in eager:
        torch.testing.assert_close(replayed[name], eager[name], rtol=1e-4, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("autocast, compiled", [(False, False), (True, True)])
def test_cuda_graph_replays_match_eager_steps(autocast, compiled):
    """Real captures (flex attention, the Triton soft cross-entropy; bf16 autocast and the compiled draft layer in
    the second case): every replayed step's loss and gradients are the eager step's."""
    batches = [{k: (v.cuda() if v is not None else None) for k, v in batch_of(64, seed).items()} for seed in range(5)]
    runs = []
    for graphed in (False, True):
        draft, loss_fn = tiny_draft_and_loss("cuda", compiled)
        if graphed:
            loss_fn = StepGraphs(loss_fn, list(draft.parameters()), warmup=2, strict=True)
        runs.append(train(draft, loss_fn, batches, autocast=autocast))
        assert not graphed or len(loss_fn.graphs) == 1
    tolerance = dict(rtol=2e-2, atol=1e-3) if autocast else dict(rtol=1e-4, atol=1e-5)
    (eager_losses, _, eager_grads), (losses, _, grads) = runs
    for got, want in zip(losses, eager_losses):
        torch.testing.assert_close(got, want, **tolerance)
    for got, want in zip(grads, eager_grads):
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, **tolerance)
