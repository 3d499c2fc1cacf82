"""Training's throughput and memory options: train.optimizer (adamw8bit, adamw8bit_fused), train.compile
(torch.compile of the draft layer's parts and of the target's decoder layers) and their errors. CPU; compiling
tests are `slow`."""
import pytest
import torch

from specdraft.config import TargetConfig
from specdraft.core.errors import SpecdraftError
from specdraft.layers.compile import Compiled, compile_decoder_layers, compile_enabled
from specdraft.core.types import DraftBatch, DraftContext
from specdraft.targets import capture_features, load_target
from specdraft.train.module import build_optimizer


@pytest.fixture(scope="module")
def target(tiny_target_dir):
    return load_target(TargetConfig(path=str(tiny_target_dir)))


def test_adamw8bit_keeps_8_bit_moments_and_trains():
    torch.manual_seed(0)
    weight = torch.nn.Parameter(torch.randn(64, 128))
    optimizer = build_optimizer("adamw8bit", [{"params": [weight]}], lr=1e-2, weight_decay=0.0)
    losses = []
    for _ in range(5):
        loss = (weight ** 2).sum()
        losses.append(float(loss.detach()))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    state = optimizer.state[weight]
    assert state["state1"].dtype == torch.uint8 and state["state2"].dtype == torch.uint8
    assert losses[-1] < losses[0]


def test_training_with_adamw8bit_fused_checkpoints_and_resumes(tmp_path, tiny_target_dir, distilled):
    """`train` with train.optimizer=adamw8bit_fused (the Triton kernel, interpreted here): the checkpoint holds
    8-bit codes, and a resume continues from it."""
    from specdraft.recipes import load_recipe
    from specdraft.train.trainer import run_train
    from tests.test_train_export_eval import make_recipe

    recipe = make_recipe(tmp_path, tiny_target_dir, distilled, max_steps=2, val_every_steps=2, resume="auto",
                         optimizer="adamw8bit_fused")
    def saved_steps_of_quantized_states():
        last = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=False, map_location="cpu")
        return {int(s["step"]) for s in last["optimizer_states"][0]["state"].values()
                if s.get("exp_avg_codes", torch.zeros(0)).dtype == torch.int8}

    assert run_train(load_recipe(recipe))["steps"] == 2
    assert saved_steps_of_quantized_states() == {2}
    assert run_train(load_recipe(recipe, ["train.max_steps=3"]))["steps"] == 3
    assert saved_steps_of_quantized_states() == {3}  # the loaded codes kept their dtype and their step count


def test_unknown_optimizer_is_an_error():
    with pytest.raises(SpecdraftError, match="unknown train.optimizer 'sgd'; valid: auto, adamw, adamw8bit, adamw8bit_fused"):
        build_optimizer("sgd", [{"params": [torch.nn.Parameter(torch.zeros(2))]}], lr=1e-3, weight_decay=0.0)


@pytest.mark.parametrize("setting, device, expected", [("auto", "cpu", False), ("auto", "cuda", True),
                                                       ("true", "cpu", True), ("false", "cuda", False)])
def test_compile_setting_resolves_per_device(setting, device, expected):
    assert compile_enabled(setting, device) is expected


def test_compile_auto_leaves_zero3_eager():
    from specdraft.config import TrainConfig

    assert TrainConfig().compile_setting() == "auto"
    assert TrainConfig(strategy="deepspeed_stage_2").compile_setting() == "auto"
    assert TrainConfig(strategy="deepspeed_stage_3").compile_setting() == "false"
    assert TrainConfig(strategy="deepspeed_stage_3", compile="true").compile_setting() == "true"


@pytest.mark.parametrize("device, strategy, dtype, expected", [
    ("cuda", "auto", torch.float32, "adamw8bit_fused"), ("cuda", "deepspeed_stage_2", torch.float32, "adamw8bit_fused"),
    ("cpu", "auto", torch.float32, "adamw"), ("cuda", "auto", torch.bfloat16, "adamw"),
    ("cuda", "deepspeed_stage_3", torch.float32, "adamw")])
def test_optimizer_auto_is_the_fused_8bit_adamw_for_float32_weights_on_cuda(device, strategy, dtype, expected):
    from specdraft.config import TrainConfig
    from specdraft.train.module import optimizer_choice

    params = [torch.nn.Parameter(torch.zeros(4, dtype=dtype))]
    assert optimizer_choice(TrainConfig(strategy=strategy), torch.device(device), params) == expected
    assert optimizer_choice(TrainConfig(strategy=strategy, optimizer="adamw8bit"), device, params) == "adamw8bit"


def test_a_compile_failure_names_the_key_to_turn_it_off(monkeypatch):
    def failing_backend(graph, example_inputs):
        raise RuntimeError("no C++ compiler")

    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: real_compile(fn, backend=failing_backend))
    torch._dynamo.reset()
    with pytest.raises(SpecdraftError, match=r"torch.compile of the part failed .*set train.compile=false"):
        Compiled(lambda x: x + 1, "the part")(torch.ones(2))


def test_a_platform_without_torch_compile_names_the_key(monkeypatch):
    def unsupported(fn, **kwargs):
        raise RuntimeError("Dynamo is not supported on this Python")

    monkeypatch.setattr(torch, "compile", unsupported)
    with pytest.raises(SpecdraftError, match=r"^torch.compile of the part failed \(RuntimeError: Dynamo is not "
                                             r"supported on this Python\); set train.compile=false"):
        Compiled(lambda x: x + 1, "the part")(torch.ones(2))


def _loss_and_grads(target, compiled, checkpointing, batch, device="cpu", autocast=False):
    from specdraft.methods.eagle3 import SPEC

    cfg = SPEC.config(ttt_steps=3, draft_vocab_size=256, attention="dense")
    torch.manual_seed(0)
    with torch.device(device):
        draft = SPEC.build(cfg, DraftContext(target.info, torch.arange(target.info.vocab_size),
                                             activation_checkpointing=checkpointing, compile=compiled))
    features = capture_features(target.model, batch["input_ids"], batch["attention_mask"],
                                SPEC.feature_layers(cfg, target.info))
    with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=autocast):
        out = SPEC.loss(draft, DraftBatch(batch["input_ids"], batch["loss_mask"], batch["attention_mask"], features),
                        cfg)
    out.loss.backward()
    return out.loss.detach(), {name: p.grad for name, p in draft.named_parameters()}


def _compiled_matches_eager(target, checkpointing, device, autocast=False):
    """Compiled against eager: the loss, and each weight's gradient within a share of the eager one's norm
    (float32: 1e-4, rounding in the long reductions of the weight gradients; bf16 autocast, as training's
    bf16-mixed: 5%). Every weight must get a nonzero gradient; a failure names every weight out of bounds."""
    torch._dynamo.reset()
    ids = torch.randint(0, target.info.vocab_size, (2, 24), device=device)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": torch.ones_like(ids)}
    eager_loss, eager_grads = _loss_and_grads(target, False, checkpointing, batch, device, autocast)
    compiled_loss, compiled_grads = _loss_and_grads(target, True, checkpointing, batch, device, autocast)
    torch.testing.assert_close(compiled_loss, eager_loss, rtol=1e-2 if autocast else 1e-5, atol=1e-6)
    share = 0.05 if autocast else 1e-4
    far = []
    for name, grad in eager_grads.items():
        assert grad is not None and compiled_grads[name] is not None, name  # every weight learns
        assert grad.norm() > 0 and compiled_grads[name].norm() > 0, name
        relative = ((compiled_grads[name] - grad).norm() / grad.norm()).item()
        if relative > share:
            far.append(f"{name}: {relative:.2e}")
    assert not far, f"gradients further than {share} of the eager norm: {far}"


@pytest.mark.slow
@pytest.mark.parametrize("checkpointing", ["none", "selective", "full"])
def test_compiled_draft_layer_gives_the_eager_loss_and_gradients(target, checkpointing):
    """The draft layer's parts under torch.compile (Inductor on the CPU) compute what the eager ones do, with
    each activation checkpointing mode around them."""
    _compiled_matches_eager(target, checkpointing, "cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("checkpointing, autocast", [("none", False), ("selective", False), ("swiglu", True),
                                                     ("selective", True)])
def test_compiled_draft_layer_gives_the_eager_gradients_on_the_gpu(target, checkpointing, autocast):
    """The same on CUDA (float32, and bf16 autocast as training runs), where tests/test_multi_gpu.py once found
    midlayer.hidden_norm.weight unchanged after steps with train.compile on: the check to run before making it
    the default again."""
    target.model.to("cuda")
    try:
        _compiled_matches_eager(target, checkpointing, "cuda", autocast)
    finally:
        target.model.to("cpu")


@pytest.mark.slow
def test_compiled_target_layers_capture_the_same_features(target):
    """Compiling the target's decoder layers (their forward) leaves capture_features' hooks working."""
    import copy

    torch._dynamo.reset()
    ids = torch.randint(0, target.info.vocab_size, (1, 16))
    eager = capture_features(target.model, ids, torch.ones_like(ids), [1, 2])
    model = copy.deepcopy(target.model)
    assert compile_decoder_layers(model) == len(model.get_decoder().layers)
    assert compile_decoder_layers(model) == 0  # idempotent
    compiled = capture_features(model, ids, torch.ones_like(ids), [1, 2])
    assert set(compiled.hidden_states) == set(eager.hidden_states) == {0, 1, 2}
    for index, hidden in eager.hidden_states.items():
        torch.testing.assert_close(compiled.hidden_states[index], hidden, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(compiled.final_hidden, eager.final_hidden, rtol=1e-5, atol=1e-5)


def test_training_with_adamw8bit_and_selective_checkpointing(tmp_path, tiny_target_dir, distilled, monkeypatch):
    """`train` with train.optimizer=adamw8bit and train.activation_checkpointing=selective (compile: auto by
    default, eager on the CPU): the optimizer is bitsandbytes', the draft runs selective, and the run finishes."""
    from specdraft.recipes import load_recipe
    from specdraft.train.trainer import run_train
    from tests.test_train_export_eval import make_recipe

    recipe = load_recipe(make_recipe(tmp_path, tiny_target_dir, distilled, max_steps=2, val_every_steps=2,
                                     optimizer="adamw8bit", activation_checkpointing="selective"))
    assert recipe.train.compile == "auto"
    from specdraft.train import module as module_file

    built = []
    monkeypatch.setattr(module_file, "build_optimizer",
                        lambda *args, **kwargs: built.append(build_optimizer(*args, **kwargs)) or built[-1])
    summary = run_train(recipe)
    assert summary["steps"] == 2 and summary["best"] >= 1.0
    assert type(built[0]).__name__ == "AdamW8bit"
