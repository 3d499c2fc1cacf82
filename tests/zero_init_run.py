"""One DeepSpeed rank (gloo, CPU) that builds models under zero.Init, ZeRO-3's partitioned construction, and
compares them with the same models built plainly. For tests/test_zero_init.py.

    RANK=0 WORLD_SIZE=1 MASTER_PORT=p python -m tests.zero_init_run drafts '{"eagle3": {"ttt_steps": 3}, ...}'
        every method's draft, same seed, under the zero.Init Lightning enters for deepspeed_stage_3
    RANK=0 WORLD_SIZE=1 MASTER_PORT=p python -m tests.zero_init_run losses '{"eagle3": {"ttt_steps": 3}, ...}'
        each draft under DeepSpeed's ZeRO-3 engine: its training loss and gradients on random target features
        against the same draft's built plainly (a draft that reads a submodule's weight outside that submodule's
        forward must register it with DeepSpeed, or finds it partitioned)
    RANK=r WORLD_SIZE=2 MASTER_PORT=p python -m tests.zero_init_run two_ranks '{"eagle3": {"ttt_steps": 7}, ...}'
        each draft trained 3 steps on 2 ranks under the ZeRO-3 engine, called as Lightning calls it (the
        engine's module forward runs the loss), against the plain draft trained on both ranks' rows: its
        weights must agree, and once DeepSpeed has recorded a step's trace, each step must gather the draft's
        partitioned weights once (its TTT unrolls reuse them), not once per unroll
    RANK=r WORLD_SIZE=2 MASTER_PORT=p python -m tests.zero_init_run whole_weights '{"eagle3": {"ttt_steps": 7}, ...}'
        as two_ranks, with the engine's weights kept whole as train.zero3_persist=auto does on a GPU
        (specdraft.train.zero3): every weight persistent and whole, no ZeRO-3 hook on any module (nor on a frozen
        target held beside the engine, as the online feature source holds it), PyTorch's own linear, nothing
        gathered in a forward or backward, the weights still whole after `gathered` reads and writes them and
        after a checkpoint's save and load, and the plain draft's weights after 3 steps
    RANK=0 WORLD_SIZE=1 MASTER_PORT=p python -m tests.zero_init_run target TARGET_DIR [no-guard]
        the frozen target as train.shard_target builds it (bf16) against load_target's (bf16): its buffers and
        the features it gives; no-guard: with a Transformers that lacks prevent_arange_dtype_change

Prints `differs WHAT NAME` for each difference found, then `done`.
"""
import json
import os
import sys

import torch

from specdraft.testing.zero3 import LossModule, init_gloo_rank, plain_and_sharded, random_batch


def drafts(cases: dict) -> None:
    import deepspeed

    from specdraft.core.types import DraftContext, TargetInfo
    from specdraft.testing.tiny import tiny_llama_config

    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}}
    ctx = DraftContext(target=TargetInfo.from_hf_config(tiny_llama_config(), "tiny"))
    for name, settings in cases.items():
        spec, cfg, plain, sharded = plain_and_sharded(name, settings, ctx, config)
        params = dict(sharded.named_parameters())
        assert all(hasattr(p, "ds_id") for p in params.values()), name  # built partitioned
        with deepspeed.zero.GatheredParameters(list(params.values())):
            for key, value in plain.named_parameters():
                if not torch.equal(params[key].detach(), value.detach()):
                    print("differs", name, key, flush=True)


def _rows(batch, start: int, stop: int):
    """Rows start..stop-1 of a DraftBatch from random_batch."""
    from specdraft.core.types import DraftBatch, TargetFeatures

    feats = batch.features
    features = TargetFeatures(hidden_states={i: h[start:stop] for i, h in feats.hidden_states.items()},
                              final_hidden=feats.final_hidden[start:stop], lm_head=feats.lm_head,
                              embed_tokens=feats.embed_tokens)
    ids = batch.input_ids[start:stop]
    return DraftBatch(ids, torch.ones_like(ids), torch.ones_like(ids), features)


def losses(cases: dict) -> None:
    import deepspeed
    from transformers import LlamaForCausalLM

    from specdraft.core.types import DraftContext, TargetInfo
    from specdraft.testing.tiny import tiny_llama_config

    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3},
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}}
    info = TargetInfo.from_hf_config(tiny_llama_config(), "tiny")
    ctx = DraftContext(target=info, token_counts=torch.arange(info.vocab_size))
    target_model = LlamaForCausalLM(tiny_llama_config()).eval()  # for drafts that run the target's own parts
    for name, settings in cases.items():
        spec, cfg, plain, sharded = plain_and_sharded(name, settings, ctx, config)
        if spec.bind_target is not None:
            spec.bind_target(plain, target_model)
            spec.bind_target(sharded, target_model)
        engine, *_ = deepspeed.initialize(model=sharded, config=config, model_parameters=sharded.parameters())
        batch = random_batch(spec, cfg, info, torch.Generator().manual_seed(0))
        torch.manual_seed(1)  # a loss may draw (P-EAGLE's drop-token sampling): both calls draw the same
        expected = spec.loss(plain, batch, cfg).loss
        expected.backward()
        torch.manual_seed(1)
        got = spec.loss(engine.module, batch, cfg).loss
        engine.backward(got)
        if not torch.allclose(got.detach(), expected.detach(), rtol=1e-5, atol=1e-6):
            print("differs", name, "loss", float(got), float(expected), flush=True)
        for key, param in engine.module.named_parameters():
            grad = deepspeed.utils.safe_get_full_grad(param)
            reference = dict(plain.named_parameters())[key].grad
            if (grad is None) != (reference is None) or (grad is not None and not
                                                         torch.allclose(grad, reference, rtol=1e-4, atol=1e-6)):
                print("differs", name, "grad", key, flush=True)


class _Gathers:
    """Elements that deepspeed.comm's all-gathers write while counting (the output's size: the whole weight)."""

    def __init__(self):
        import deepspeed.comm as dist

        self.elements, self.counting = 0, False
        for name in ("allgather_fn", "all_gather_into_tensor"):
            setattr(dist, name, self._counted(getattr(dist, name)))

    def _counted(self, gather):
        def counted(output, *args, **kwargs):
            if self.counting:
                self.elements += output.numel()
            return gather(output, *args, **kwargs)
        return counted


def _two_rank_setup():
    """-> this rank, the AdamW settings, a ZeRO-3 config with every weight partitioned (as a large draft's), the
    tiny target's info and a draft context."""
    from specdraft.core.types import DraftContext, TargetInfo
    from specdraft.testing.tiny import tiny_llama_config

    adamw = {"lr": 1e-3, "betas": [0.9, 0.95], "weight_decay": 0.0}
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_clipping": 0.0,  # DeepSpeed's default clips at 1
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},  # all partitioned
              "optimizer": {"type": "AdamW", "params": {**adamw, "torch_adam": True}}}
    info = TargetInfo.from_hf_config(tiny_llama_config(), "tiny")
    return int(os.environ["RANK"]), adamw, config, info, DraftContext(target=info,
                                                                      token_counts=torch.arange(info.vocab_size))


def two_ranks(cases: dict) -> None:
    """Each draft, 3 steps on 2 ranks (one row each) under ZeRO-3 against the plain draft on both rows with
    torch's AdamW in this process: the step's all-gathers, then the weights."""
    import deepspeed

    rank, adamw, config, info, ctx = _two_rank_setup()
    counter = _Gathers()
    for name, settings in cases.items():
        spec, cfg, plain, sharded = plain_and_sharded(name, settings, ctx, config)
        _bound_target(spec, plain, sharded)
        engine, *_ = deepspeed.initialize(model=LossModule(spec, cfg, sharded), config=config,
                                          model_parameters=sharded.parameters())
        optimizer = torch.optim.AdamW(plain.parameters(), **adamw)
        initial = {key: value.detach().clone() for key, value in plain.named_parameters()}
        generator = torch.Generator().manual_seed(0)
        for step in range(3):  # DeepSpeed records its trace in the first step, then prefetches and keeps
            batch = random_batch(spec, cfg, info, generator, rows=1, repeat=2)
            counter.counting, counter.elements = step == 2, 0
            engine.backward(engine(_rows(batch, rank, rank + 1)))
            engine.step()
            counter.counting = False
            spec.loss(plain, batch, cfg).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        _compare_two_ranks(name, plain, sharded, initial, counter.elements)


def whole_weights(cases: dict) -> None:
    """Each draft, 3 steps on 2 ranks under ZeRO-3 with its weights whole (train.zero3_persist), against the plain
    draft on both rows."""
    import deepspeed

    from specdraft.train.zero3 import drop_module_hooks, persist_weights, persistence_config

    rank, adamw, config, info, ctx = _two_rank_setup()
    counter = _Gathers()
    for name, settings in cases.items():
        spec, cfg, plain, sharded = plain_and_sharded(name, settings, ctx, config)
        target_model = _bound_target(spec, plain, sharded)
        root = LossModule(spec, cfg, sharded)
        if not persist_weights("auto", root, device_memory=80 * 2 ** 30):
            print("differs", name, "auto keeps a tiny draft partitioned", flush=True)
        whole = {**config, "zero_optimization": {**config["zero_optimization"], **persistence_config(root)}}
        engine, zero_optimizer, *_ = deepspeed.initialize(model=root, config=whole,
                                                          model_parameters=sharded.parameters())
        if not drop_module_hooks(zero_optimizer, engine.module):
            print("differs", name, "module hooks kept", flush=True)
        _check_whole(name, root, target_model, "after the engine's start")
        optimizer = torch.optim.AdamW(plain.parameters(), **adamw)
        initial = {key: value.detach().clone() for key, value in plain.named_parameters()}
        generator = torch.Generator().manual_seed(0)
        for step in range(3):
            batch = random_batch(spec, cfg, info, generator, rows=1, repeat=2)
            counter.counting, counter.elements = True, 0
            engine.backward(engine(_rows(batch, rank, rank + 1)))
            counter.counting = False
            if counter.elements:
                print("differs", name, "gathered", counter.elements, "elements in a forward and backward", flush=True)
            engine.step()
            spec.loss(plain, batch, cfg).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            _read_and_write_gathered(sharded)
            _check_whole(name, root, target_model, f"after step {step}")
        _save_and_load(engine, name)
        _check_whole(name, root, target_model, "after a checkpoint's save and load")
        _compare_two_ranks(name, plain, sharded, initial, 0)


def _save_and_load(engine, name: str) -> None:
    """A checkpoint saved and loaded again (as every train.val_every_steps and on resume): ZeRO-3 partitions every
    weight for both and gathers the persistent ones after."""
    import tempfile

    directory = os.path.join(tempfile.gettempdir(), f"zero3-whole-{os.environ['MASTER_PORT']}-{name}")
    engine.save_checkpoint(directory, tag="step")
    if not os.listdir(os.path.join(directory, "step")):
        print("differs", name, "no checkpoint written", flush=True)
    load_path, _ = engine.load_checkpoint(directory, tag="step")
    if load_path is None:
        print("differs", name, "checkpoint not loaded", flush=True)
    torch.distributed.barrier()
    if int(os.environ["RANK"]) == 0:
        import shutil

        shutil.rmtree(directory, ignore_errors=True)


def _bound_target(spec, plain, sharded):
    """The frozen target (held outside the engine, as the online feature source holds it), bound to both drafts
    when the method runs parts of it."""
    from transformers import LlamaForCausalLM

    from specdraft.testing.tiny import tiny_llama_config

    target_model = LlamaForCausalLM(tiny_llama_config()).eval()
    if spec.bind_target is not None:
        spec.bind_target(plain, target_model)
        spec.bind_target(sharded, target_model)
    return target_model


def _read_and_write_gathered(draft) -> None:
    """What training does with `gathered` between steps: the validation's read of every weight, and a write."""
    from specdraft.layers.zero import gathered

    params = list(draft.parameters())
    with gathered(params, modifier_rank=None):
        [param.detach().sum() for param in params]
    with gathered(params[:1]), torch.no_grad():
        params[0].mul_(1.0)


def _check_whole(name: str, root, target_model, when: str) -> None:
    """Prints what differs from whole weights without ZeRO-3's module hooks: a weight not persistent or not whole,
    a module (the engine's or the frozen target's) with a forward or backward hook (but the engine's own pair on
    its root: one call a step, for its timers), DeepSpeed's linear in torch's place."""
    for key, param in root.named_parameters():
        if not param.ds_persist or param.ds_status.name != "AVAILABLE":
            print("differs", name, "weight", key, param.ds_status.name, when, flush=True)
    for owner, module in [("engine", root), ("target", target_model)]:
        for sub in module.modules():
            hooks = [hook for hooks in (sub._forward_pre_hooks, sub._forward_hooks, sub._backward_hooks,
                                        sub._backward_pre_hooks) for hook in hooks.values()
                     if not (sub is root and hook.__qualname__.startswith("DeepSpeedEngine."))]
            if hooks:
                print("differs", name, owner, "module hooked", type(sub).__name__, when, hooks, flush=True)
    if any(hasattr(param, "ds_id") for param in target_model.parameters()):
        print("differs", name, "the frozen target's weights were converted to ZeRO-3 parameters", when, flush=True)
    if torch.nn.functional.linear is not torch._C._nn.linear:
        print("differs", name, "linear is DeepSpeed's", when, flush=True)


def _compare_two_ranks(name: str, plain, sharded, initial: dict, gathered: int) -> None:
    """Prints what differs: more elements gathered in a step than the draft's weights hold; a weight further
    from the plain draft's than 1e-4 of the plain run's mean update (float32 rounding gives about 1e-7)."""
    import deepspeed

    weights = sum(p.ds_numel for p in sharded.parameters() if p.requires_grad)
    if gathered > weights:
        print("differs", name, "gathered", gathered, "elements in a step; its weights:", weights, flush=True)
    params = dict(sharded.named_parameters())
    with deepspeed.zero.GatheredParameters(list(params.values())):
        for key, value in plain.named_parameters():
            update = (value.detach() - initial[key]).abs().mean()
            if (params[key].detach() - value.detach()).abs().mean() > 1e-4 * update:
                print("differs", name, "weight after 3 steps", key, flush=True)


def target(directory: str, guard: str = "guard") -> None:
    import deepspeed
    import torch._dynamo  # noqa: F401  (imported before zero.Init patches torch's constructors, as in training:
    from transformers import LlamaForCausalLM  # noqa: F401  imported inside it, they fail)

    from specdraft.config import TargetConfig
    from specdraft.targets.features import capture_features
    from specdraft.targets.load import load_sharded_target, load_target

    if guard == "no-guard":  # Transformers before prevent_arange_dtype_change (5.17): inv_freq comes out bf16
        import transformers.integrations.deepspeed

        del transformers.integrations.deepspeed.prevent_arange_dtype_change
    cfg = TargetConfig(path=directory)
    sharded = load_sharded_target(cfg, torch.bfloat16)
    plain = load_target(cfg, "cpu", dtype="bfloat16").model
    for (name, buffer), (_, expected) in zip(sharded.named_buffers(), plain.named_buffers()):
        if buffer.dtype != expected.dtype or not torch.equal(buffer, expected):
            print("differs buffer", name, buffer.dtype, expected.dtype, flush=True)
    ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))  # [B, T]
    with deepspeed.zero.GatheredParameters(list(sharded.parameters())):
        got = capture_features(sharded, ids, torch.ones_like(ids), [1, 2])
    expected = capture_features(plain, ids, torch.ones_like(ids), [1, 2])
    for index, hidden in expected.hidden_states.items():
        if not torch.equal(got.hidden_states[index], hidden):
            print("differs hidden_state", index, flush=True)
    if not torch.equal(got.final_hidden, expected.final_hidden):
        print("differs final_hidden -", flush=True)


if __name__ == "__main__":
    init_gloo_rank()
    if sys.argv[1] == "drafts":
        drafts(json.loads(sys.argv[2]))
    elif sys.argv[1] == "losses":
        losses(json.loads(sys.argv[2]))
    elif sys.argv[1] == "two_ranks":
        two_ranks(json.loads(sys.argv[2]))
    elif sys.argv[1] == "whole_weights":
        whole_weights(json.loads(sys.argv[2]))
    else:
        target(*sys.argv[2:])
    torch.distributed.barrier()  # no rank leaves while another still talks to it
    print("done", flush=True)
    sys.stderr.flush()
    # The work is done and printed. Teardown with gloo's threads alive aborted a 2-rank run in CI ("terminate
    # called without an active exception", exit -6), with and without destroy_process_group: skip it, as
    # tests/zero_run.py does.
    os._exit(0)
