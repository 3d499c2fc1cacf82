"""Offline and hybrid target features (data.features): the dump, its guards, and training from it gives what
online training gives, resumes, and keeps no target layers. Tiny target, fp32, CPU; seconds each."""
import json
import pickle

import lightning as L
import pytest
import torch
from safetensors.torch import load_file

from specdraft.distill.features import dump_features, shard_file
from specdraft import cli
from specdraft.recipes import load_recipe
from specdraft.data.features import FINAL, FeatureStore, feature_names, features_dir, hidden_key
from specdraft.data.format import ROW_FEATURES, dataset_dir
from specdraft.core.errors import SpecdraftError
from specdraft.methods.eagle3 import SPEC
from specdraft.targets import load as load_module
from specdraft.targets import load_target
from specdraft.targets.heads import load_target_heads
from specdraft.train.data import collate
from specdraft.train.features import FeatureLookup, FeatureRows, OfflineFeatures, OnlineFeatures, collate_with_features
from specdraft.train.trainer import run_train
from tests.host_reads import HostReads
from tests.test_train_export_eval import make_recipe


def varied_distilled(directory, distilled, order=None):
    """The `distilled` fixture's rows cut to different lengths (14..32 tokens), so that batches carry padding."""
    from datasets import Dataset, load_from_disk

    rows = load_from_disk(str(dataset_dir(distilled))).to_list()
    for index, row in enumerate(rows):
        length = 14 + (index * 7) % 19
        row["input_ids"], row["loss_mask"] = row["input_ids"][:length], row["loss_mask"][:length]
    rows = [rows[k] for k in order] if order else rows
    Dataset.from_list(rows, features=ROW_FEATURES).save_to_disk(str(dataset_dir(directory)))
    return directory


SHORT = {"max_steps": 12, "val_every_steps": 6}  # 10 training rows in batches of 4: an epoch is 2.5 steps
DUMP = ["data.features=offline", "distill.shard_size=5", "distill.batch_size=3"]


@pytest.fixture()
def offline_setup(tmp_path, tiny_target_dir, distilled):
    distill_dir = varied_distilled(tmp_path / "distill", distilled)
    recipe_path = make_recipe(tmp_path, tiny_target_dir, distill_dir, **SHORT)
    return recipe_path, load_recipe(recipe_path, DUMP), distill_dir


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, tiny_target_dir, distilled):
    """A dumped distilled set and the online run on it (recipe path, recipe, distill dir, online run dir)."""
    base = tmp_path_factory.mktemp("prepared")
    distill_dir = varied_distilled(base / "distill", distilled)
    recipe_path = make_recipe(base, tiny_target_dir, distill_dir, **SHORT)
    recipe = load_recipe(recipe_path, DUMP)
    dump_features(recipe, distill_dir, "cpu")
    run_train(load_recipe(recipe_path, [f"train.output_dir={base / 'online'}"]))
    return recipe_path, recipe, distill_dir, base / "online"


class _CrashAt(L.Callback):
    def __init__(self, step):
        self.step = step

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == self.step:
            raise RuntimeError("simulated crash")


def _no_target(*args, **kwargs):
    raise AssertionError("the target model was loaded")


def test_dump_holds_the_online_features_and_resumes(offline_setup):
    _, recipe, distill_dir = offline_setup
    summary = dump_features(recipe, distill_dir, "cpu")
    directory = features_dir(distill_dir)
    assert summary["shards_written"] == 3 and summary["rows"] == 12 and summary["layers"] == [1, 2]
    manifest = json.loads((directory / "manifest.json").read_text())
    assert manifest["layers"] == [1, 2] and manifest["dtype"] == "float32" and manifest["quantization"] == "none"
    target = load_target(recipe.target)
    store = FeatureStore(directory, feature_names([1, 2]))
    ids = torch.tensor(load_from_disk_row(distill_dir, 7))[None]  # [1, n]
    online = OnlineFeatures(target.model, [1, 2])({"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    stored = store.read(7)
    torch.testing.assert_close(stored[hidden_key(2)], online.hidden_states[2][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(stored[FINAL], online.final_hidden[0], rtol=1e-5, atol=1e-5)
    before = load_file(shard_file(directory, 1))
    shard_file(directory, 1).unlink()
    assert dump_features(recipe, distill_dir, "cpu")["shards_written"] == 1
    for name, tensor in load_file(shard_file(directory, 1)).items():
        torch.testing.assert_close(tensor, before[name], msg=name)


def load_from_disk_row(distill_dir, index):
    from datasets import load_from_disk

    return load_from_disk(str(dataset_dir(distill_dir)))[index]["input_ids"]


def test_dump_refuses_a_directory_made_for_other_layers(prepared, monkeypatch):
    recipe_path, _, distill_dir, _ = prepared
    recipe = load_recipe(recipe_path, [*DUMP, "method.feature_layers=[1,3]"])
    monkeypatch.setattr(load_module, "load_target", _no_target)
    with pytest.raises(SpecdraftError, match=r"holds target layers \[1, 2\] but method.feature_layers needs \[1, 3\]"):
        dump_features(recipe, distill_dir, "cpu")


def test_offline_loss_equals_online_loss(prepared):
    from datasets import load_from_disk

    _, recipe, distill_dir, _ = prepared
    dataset = load_from_disk(str(dataset_dir(distill_dir))).with_format("numpy")
    target = load_target(recipe.target)
    heads = load_target_heads(recipe.target, embeddings=True)
    torch.testing.assert_close(heads.lm_head, target.model.lm_head.weight)
    rows = FeatureRows(dataset, FeatureLookup([FeatureStore(features_dir(distill_dir), feature_names([1, 2]))], [0]))
    rows = pickle.loads(pickle.dumps(rows.select([3, 0, 9, 5])))  # as DataLoader workers get it
    batch = collate_with_features([rows[k] for k in range(4)], max_length=30)  # cuts the longest rows
    online = OnlineFeatures(target.model, [1, 2])(collate([dataset[i] for i in (3, 0, 9, 5)], 30))
    offline = OfflineFeatures(heads.lm_head, heads.embed_tokens, [1, 2], recipe.target)(batch)
    assert batch["row_ids"].tolist() == [3, 0, 9, 5] and batch["features"][FINAL].shape[:2] == (4, 30)
    real = batch["attention_mask"].bool()  # [B, T]
    assert sorted(offline.hidden_states) == [0, 1, 2]  # 0 looked up in the embedding table
    for name, online_tensor, offline_tensor in [("final", online.final_hidden, offline.final_hidden),
                                                *[(i, online.hidden_states[i], offline.hidden_states[i])
                                                  for i in (0, 1, 2)]]:
        torch.testing.assert_close(offline_tensor[real], online_tensor[real], rtol=1e-6, atol=1e-6, msg=str(name))
    draft = SPEC.build(recipe.method, _ctx(target.info, dataset))
    losses = [SPEC.loss(draft, _draft_batch(batch, feats), recipe.method) for feats in (online, offline)]
    torch.testing.assert_close(losses[1].loss, losses[0].loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(losses[1].metrics["tau_sim"], losses[0].metrics["tau_sim"])


def _ctx(info, dataset):
    from specdraft.core.types import DraftContext
    from specdraft.train.data import answer_token_counts

    return DraftContext(target=info, token_counts=answer_token_counts(dataset, list(range(12)), info.vocab_size))


def _draft_batch(batch, features):
    from specdraft.core.types import DraftBatch

    return DraftBatch(input_ids=batch["input_ids"], loss_mask=batch["loss_mask"],
                      attention_mask=batch["attention_mask"], features=features)


def _last_weights(run_dir):
    return load_file(run_dir / "last" / "draft.safetensors")


def _assert_same_weights(run_a, run_b):
    weights_a, weights_b = _last_weights(run_a), _last_weights(run_b)
    for name in weights_a:
        torch.testing.assert_close(weights_b[name], weights_a[name], rtol=1e-4, atol=1e-5, msg=name)


def test_offline_training_matches_online_keeps_no_target_and_resumes(prepared, tmp_path, monkeypatch):
    from specdraft.train import trainer as trainer_module

    recipe_path, _, _, online_run = prepared
    monkeypatch.setattr(load_module, "load_target", _no_target)  # offline: no decoder layer is ever built
    offline = ["data.features=offline", f"train.output_dir={tmp_path / 'offline'}", "train.resume=auto"]
    build = trainer_module.build_trainer

    def crashing(*args):
        trainer = build(*args)
        trainer.callbacks.append(_CrashAt(6))
        return trainer

    monkeypatch.setattr(trainer_module, "build_trainer", crashing)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_train(load_recipe(recipe_path, offline))
    monkeypatch.setattr(trainer_module, "build_trainer", build)
    assert run_train(load_recipe(recipe_path, offline))["steps"] == 12
    _assert_same_weights(online_run, tmp_path / "offline")


def test_hybrid_caches_the_first_epoch_then_drops_the_target(prepared, tmp_path, monkeypatch):
    from specdraft.train import features as features_module

    recipe_path, _, _, online_run = prepared
    released = []
    release = features_module.HybridFeatures.release_target
    monkeypatch.setattr(features_module.HybridFeatures, "release_target",
                        lambda self: released.append(True) or release(self))
    hybrid = ["data.features=hybrid", f"train.output_dir={tmp_path / 'hybrid'}", "train.resume=auto"]
    run_train(load_recipe(recipe_path, hybrid))
    assert released == [True]  # once the first validation had cached the validation rows too
    _assert_same_weights(online_run, tmp_path / "hybrid")
    assert len(FeatureStore(tmp_path / "hybrid" / "features", feature_names([1, 2]))) == 12
    monkeypatch.setattr(load_module, "load_target", _no_target)  # resumed with a full cache: offline
    assert run_train(load_recipe(recipe_path, [*hybrid, "train.max_steps=14"]))["steps"] == 14


def test_offline_without_a_dump_is_a_one_line_error(offline_setup, capsys):
    recipe_path, _, _ = offline_setup
    assert cli.main(["train", str(recipe_path), "data.features=offline"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "no target features at" in err[-1] and "data.features=offline" in err[-1]
    assert err[-1].startswith("specdraft: error: ") and sum("error" in line for line in err) == 1


def test_offline_refuses_features_of_other_rows(offline_setup, distilled):
    recipe_path, recipe, distill_dir = offline_setup
    dump_features(recipe, distill_dir, "cpu")
    varied_distilled(distill_dir, distilled, order=list(range(11, -1, -1)))  # the same rows, another order
    with pytest.raises(SpecdraftError, match="holds features of other token rows"):
        run_train(load_recipe(recipe_path, ["data.features=offline"]))


def test_bad_feature_mode_names_the_valid_ones(prepared):
    recipe_path = prepared[0]
    with pytest.raises(SpecdraftError, match="unknown data.features 'disk'; valid: online, offline, hybrid"):
        load_recipe(recipe_path, ["data.features=disk"])


def test_distill_data_dumps_features_and_a_rerun_loads_nothing(tmp_path, tiny_target_dir, monkeypatch, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"question {i}"}) + "\n" for i in range(3)))
    recipe_path = tmp_path / "recipe.yaml"
    recipe_path.write_text(f"target: {{path: {tiny_target_dir}}}\nmethod: {{name: eagle3}}\n"
                           f"data: {{prompts: [{prompts}], max_length: 64, features: offline}}\n"
                           f"distill: {{output_dir: {tmp_path / 'out'}, max_new_tokens: 6, shard_size: 2}}\n")
    assert cli.main(["distill-data", str(recipe_path)]) == 0
    directory = features_dir(tmp_path / "out")
    files = sorted(directory.glob("*.safetensors"))
    assert [f.name for f in files] == ["shard-00000.safetensors", "shard-00001.safetensors"]
    assert len(FeatureStore(directory, feature_names([1, 2]))) == 3
    stamps = [f.stat().st_mtime_ns for f in files]
    monkeypatch.setattr(load_module, "load_target", _no_target)
    assert cli.main(["distill-data", str(recipe_path)]) == 0
    assert [f.stat().st_mtime_ns for f in files] == stamps


def test_online_target_keeps_its_float32_rotary_frequencies(tiny_target_dir):
    """A bf16 target set up for online features keeps what from_pretrained gives it, the rotary inv_freq in float32
    included: the features are those of the target as evaluated and served (and as the offline dump stores
    them), not those of rotary angles rounded through bf16 frequencies."""
    from specdraft.config import TargetConfig

    cfg = TargetConfig(path=str(tiny_target_dir))
    as_loaded = load_target(cfg, "cpu", dtype="bfloat16").model
    online = OnlineFeatures(load_target(cfg, "cpu", dtype="bfloat16").model, [1, 2])
    online.setup(torch.device("cpu"))
    assert {b.dtype for b in online.model.buffers()} == {torch.float32}
    assert {p.dtype for p in online.model.parameters()} == {torch.bfloat16}
    ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))  # [B, T]
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    got, expected = online(batch), OnlineFeatures(as_loaded, [1, 2])(batch)
    assert torch.equal(got.final_hidden, expected.final_hidden)
    for index, hidden in expected.hidden_states.items():
        assert torch.equal(got.hidden_states[index], hidden), index


def test_online_features_of_right_padded_rows_need_no_mask(tiny_target_dir):
    """OnlineFeatures runs the target without the batch's attention mask (no device sync, the causal kernel):
    on right-padded rows every real token's states are those the masked forward gives. The padded columns'
    states differ (they see each other now), so the check would fail if the padding sat on the left."""
    from specdraft.config import TargetConfig
    from specdraft.targets.features import capture_features

    model = load_target(TargetConfig(path=str(tiny_target_dir)), "cpu").model
    rows = [torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(n)) for n in (32, 20, 9)]
    batch = collate([{"input_ids": r.numpy(), "loss_mask": r.numpy() * 0 + 1} for r in rows], max_length=64)
    got = OnlineFeatures(model, [1, 2])(batch)
    masked = capture_features(model, batch["input_ids"], batch["attention_mask"], [1, 2])
    real = batch["attention_mask"].bool()  # [B, T]
    assert not real.all()
    for index, hidden in masked.hidden_states.items():
        torch.testing.assert_close(got.hidden_states[index][real], hidden[real], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.final_hidden[real], masked.final_hidden[real], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(got.final_hidden[~real], masked.final_hidden[~real], atol=1e-3)


def test_online_features_never_read_a_tensor_back_to_the_host(tiny_target_dir):
    """The online target forward (one per training step) reads no tensor value on the host; Hugging Face's own
    forward with the batch's mask does (its mask check), which shows the counter sees such reads."""
    from specdraft.config import TargetConfig
    from specdraft.targets.features import capture_features

    model = load_target(TargetConfig(path=str(tiny_target_dir)), "cpu").model
    ids = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(0))  # [B, T]
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    with HostReads() as masked:
        capture_features(model, ids, batch["attention_mask"], [1, 2])
    with HostReads() as online:
        OnlineFeatures(model, [1, 2])(batch)
    assert masked.count > 0
    assert online.count == 0
    assert model.config._attn_implementation == "sdpa"  # restored after the forward


def test_online_target_runs_torch_linear_under_a_replaced_one(tiny_target_dir, monkeypatch):
    """DeepSpeed's ZeRO-3 replaces torch.nn.functional.linear process-wide (memory_efficient_linear). The frozen
    target's forward runs PyTorch's own linear instead, with the same features; the replacement is back after it,
    and a draft's linear outside the target's forward still goes through it."""
    import torch.nn.functional as F

    from specdraft.config import TargetConfig

    model = load_target(TargetConfig(path=str(tiny_target_dir)), "cpu").model
    ids = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(0))  # [B, T]
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    expected = OnlineFeatures(model, [1, 2])(batch)
    calls = []

    def replacement(input, weight, bias=None):
        calls.append(weight.shape)
        return torch._C._nn.linear(input, weight, bias)

    monkeypatch.setattr(F, "linear", replacement)
    got = OnlineFeatures(model, [1, 2])(batch)
    assert calls == []
    assert F.linear is replacement
    torch.nn.Linear(4, 3)(torch.ones(1, 4))
    assert calls == [(3, 4)]
    torch.testing.assert_close(got.final_hidden, expected.final_hidden, rtol=0, atol=0)
    for index, hidden in expected.hidden_states.items():
        torch.testing.assert_close(got.hidden_states[index], hidden, rtol=0, atol=0)


@pytest.mark.parametrize("setting", ["eager", "sliding_window", "sliding_layers"])
def test_targets_with_local_attention_or_not_on_sdpa_keep_their_mask(tiny_target_dir, setting):
    """causal_attention applies to SDPA targets whose every layer attends to the whole prefix; the others run
    their own attention (a sliding window needs the mask Hugging Face builds)."""
    from specdraft.config import TargetConfig
    from specdraft.targets.features import causal_attention

    model = load_target(TargetConfig(path=str(tiny_target_dir)), "cpu").model
    config = model.config
    if setting == "eager":
        config._attn_implementation = "eager"
    elif setting == "sliding_window":
        config.use_sliding_window, config.sliding_window = True, 8
    else:
        config.layer_types = ["sliding_attention"] + ["full_attention"] * (config.num_hidden_layers - 1)
    before = config._attn_implementation
    with causal_attention(model):
        assert config._attn_implementation == before
    plain = load_target(TargetConfig(path=str(tiny_target_dir)), "cpu").model
    with causal_attention(plain):
        assert plain.config._attn_implementation != "sdpa"
