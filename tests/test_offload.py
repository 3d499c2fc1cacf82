"""train.activation_offload (specdraft.train.offload): the step's large kept activations go to the host and come
back for the backward, leaving the gradients unchanged; weights and small tensors stay; a fit with it ends with the
weights of one without it; it refuses a CUDA graph with an error naming both keys and keeps train.cuda_graphs=auto
eager. CPU: the hooks run and count (nothing to move to); the device copies and the memory they free are `gpu`."""
import pytest
import torch

from specdraft.core.errors import SpecdraftError
from specdraft.train.graphs import GraphNeeds, graphs_enabled
from specdraft.train.offload import Offload


def two_layers(x, first, second):
    return torch.nn.functional.silu(x @ first) @ second  # [N, H]


def gradients(offload=None):
    torch.manual_seed(0)
    first, second = (torch.nn.Parameter(torch.randn(64, 64)) for _ in range(2))
    x = torch.randn(512, 64, requires_grad=True)
    if offload is None:
        two_layers(x, first, second).square().sum().backward()
    else:
        with offload.context():
            loss = two_layers(x, first, second).square().sum()
        loss.backward()  # outside the context, as the trainer's backward runs
    return [t.grad for t in (first, second, x)]


def test_gradients_are_the_same_with_the_activations_offloaded():
    offload = Offload(min_bytes=64 * 64 * 4 + 1)  # above a weight's size, below an activation's
    for plain, offloaded in zip(gradients(), gradients(offload)):
        torch.testing.assert_close(offloaded, plain, rtol=0, atol=0)
    # silu's input, the second matmul's input and square's: [512, 64] float32 each (128 KiB); x (a leaf that keeps
    # its grad) and the weights stay
    assert offload.offloaded_bytes == 3 * 512 * 64 * 4


def test_weights_leaves_and_small_tensors_stay():
    offload = Offload(min_bytes=1024)
    weight = torch.nn.Parameter(torch.randn(64, 64))
    assert not offload.wants(weight) and not offload.wants(torch.randn(64, 64, requires_grad=True))
    assert not offload.wants(torch.randn(8)) and offload.wants(torch.randn(64, 64) * 2)
    assert offload.unpack(offload.pack(torch.ones(2))) is not None  # kept as it is


def test_a_cuda_graph_cannot_capture_it():
    from specdraft.config import TrainConfig

    with pytest.raises(SpecdraftError, match="train.activation_offload=true.*train.cuda_graphs=auto or false"):
        TrainConfig(activation_offload=True, cuda_graphs="true")
    needs = GraphNeeds(cuda=True, single_device=True, strategy="auto", checkpointing="swiglu",
                       features_graph_safe=True, method_graph_safe=True, offload=True)
    assert needs.unmet() == ["train.activation_offload=false (its copies to the host are not capturable)"]
    assert not graphs_enabled("auto", needs)


def test_a_fit_with_offloaded_activations_ends_with_the_weights_of_one_without(tmp_path, tiny_target_dir,
                                                                              distilled, monkeypatch):
    from safetensors.torch import load_file

    from specdraft.drafts import SNAPSHOT_FILE
    from specdraft.recipes import load_recipe
    from specdraft.train import module
    from specdraft.train.trainer import run_train

    made = []

    class Recording(Offload):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.min_bytes = 1 << 12  # the tiny draft's activations are KBs
            made.append(self)

    monkeypatch.setattr(module, "Offload", Recording)
    weights = {}
    for setting in ("false", "true"):
        out = tmp_path / setting
        recipe = out / "recipe.yaml"
        out.mkdir()
        recipe.write_text(f"""
target: {{path: {tiny_target_dir}, dtype: float32}}
method: {{name: eagle3, ttt_steps: 3, draft_vocab_size: 256}}
data: {{val_fraction: 0.2, max_length: 256}}
distill: {{output_dir: {distilled}}}
train: {{output_dir: {out / 'run'}, max_steps: 3, micro_batch_size: 2, val_every_steps: 3, lr: 3.0e-3,
         warmup_steps: 1, activation_offload: {setting}}}
""")
        run_train(load_recipe(recipe))
        weights[setting] = load_file(str(out / "run" / "last" / SNAPSHOT_FILE))
    assert len(made) == 1 and made[0].offloaded_bytes > 0  # the last step moved its activations
    for name, value in weights["false"].items():
        torch.testing.assert_close(weights["true"][name], value, rtol=0, atol=0)


@pytest.mark.gpu
def test_on_cuda_the_activations_leave_the_device_and_come_back():
    device = torch.device("cuda")
    torch.manual_seed(0)
    first, second = (torch.nn.Parameter(torch.randn(1024, 1024, device=device)) for _ in range(2))
    x = torch.randn(16384, 1024, device=device)

    def step(offload):
        first.grad = second.grad = None
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        with offload.context():
            loss = sum(two_layers(x, first, second).square().sum() for _ in range(4))  # [16384, 1024] kept x 8
        kept = torch.cuda.memory_allocated() - base
        loss.backward()
        torch.cuda.synchronize()
        return kept, [first.grad.clone(), second.grad.clone()]

    kept_all, plain = step(Offload(min_bytes=1 << 62))  # nothing large enough: all kept
    kept_some, offloaded = step(Offload())
    assert kept_some < kept_all / 4  # 8 activations of 64 MiB each stayed on the device the first time
    for a, b in zip(offloaded, plain):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
