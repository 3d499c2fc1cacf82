"""The contract every registered method keeps, on a tiny random target (CPU, seconds per method): it trains
through the real trainer, every export format reloads through `from_export` into a draft that computes the
same loss and drafts the same tokens, and the evaluator and the runtime decode losslessly with it. An add-on
method (it extends a trained draft and trains on records of its own) goes through distill-data (counted,
resumable), train, export (its base inside) and the runtime, exact unless asked otherwise."""
import json

import pytest
import torch
from safetensors.torch import load_file

from specdraft.config import RuntimeConfig

from specdraft.recipes import load_recipe
from specdraft.drafts import EXPORT_FILE, load_draft
from specdraft.eval.run import run_eval
from specdraft.export import export_draft
from specdraft.methods import METHODS
from specdraft.core.types import DraftBatch, DraftContext, TargetFeatures
from specdraft.runtime.load import load_runtime
from specdraft.decoding.tree import TreeShape
from specdraft.targets import capture_features, load_target
from specdraft.train.trainer import run_train
from tests.addons import ADDON_METHODS, DRAFT_METHODS, addon_recipe, run_addon_stages, train_base_export, write_prompts
from tests.oracles import ChainState, chain_of

CASES = {  # small settings per method; every registered method needs one
    "eagle3": {"ttt_steps": 3, "draft_vocab_size": 256},
    "poss": {"ttt_steps": 3, "draft_vocab_size": 256, "num_specialists": 2, "positions_per_specialist": 2},
    "kangaroo": {"ttt_steps": 3, "draft_vocab_size": 256, "exit_layer": 2},
}
LABELS = [{"prefix": "ab", "candidate": "c", "label": 1}, {"prefix": "a", "candidate_id": 7, "label": 0}]
ADDON_CASES = {  # every add-on: its settings besides the base draft, the prompt records its data stage reads, and
    # the counts they give
    "judge": ({}, [{"prompt": f"question {i}?", "labels": LABELS} for i in range(4)] +
              [{"prompt": "a label without its candidate", "labels": [{"prefix": "x", "label": 1}]}],
              {"input": 5, "ok": 4, "error": 1, "skipped": 0}),
}


@pytest.fixture(autouse=True)
def _reference_kernels(monkeypatch):
    """The plain PyTorch kernels: these tests are about the methods (tests/kernels/ checks the Triton ones,
    which the CPU would only interpret, slowly)."""
    monkeypatch.setenv("SPECDRAFT_KERNELS", "reference")


def test_every_method_has_a_case():
    assert set(CASES) == set(DRAFT_METHODS) and set(ADDON_CASES) == set(ADDON_METHODS)


def _recipe(tmp_path, target_dir, distill_dir, method: str):
    prompts = tmp_path / "eval.jsonl"
    prompts.write_text("".join(json.dumps({"turns": [f"question {i}?"]}) + "\n" for i in range(2)))
    method_yaml = ", ".join(f"{k}: {v}" for k, v in {"name": method, **CASES[method]}.items())
    path = tmp_path / "recipe.yaml"
    path.write_text(f"""
target: {{path: {target_dir}}}
method: {{{method_yaml}}}
data: {{val_fraction: 0.2}}
distill: {{output_dir: {distill_dir}}}
train: {{output_dir: {tmp_path / 'run'}, max_steps: 4, micro_batch_size: 4, val_every_steps: 2, lr: 3.0e-3,
         warmup_steps: 1, log_every_steps: 2}}
eval: {{prompts: {prompts}, max_new_tokens: 16, num_draft_tokens: 3}}
""")
    return load_recipe(path)


def _outputs(loaded, target, ids):
    """(loss, drafted tokens) of a loaded draft on ids [1, T]: what must survive an export."""
    spec, draft = loaded.spec, loaded.draft
    if spec.bind_target is not None:
        spec.bind_target(draft, target.model)
    ones = torch.ones_like(ids)
    feats = capture_features(target.model, ids, ones, spec.feature_layers(loaded.method_cfg, target.info))
    with torch.no_grad():
        loss = spec.loss(draft, DraftBatch(ids, ones, ones, feats), loaded.method_cfg).loss
    prefix = ids.shape[1] - 4
    state = ChainState(tokens=ids[:, :prefix + 1], embed=target.model.get_input_embeddings(),
                       features=TargetFeatures({i: h[:, :prefix] for i, h in feats.hidden_states.items()}))
    return loss, chain_of(spec.name)(draft, state, 3)


@pytest.mark.parametrize("method", sorted(CASES))
def test_method_trains_exports_reloads_and_decodes(tmp_path, tiny_target_dir, distilled, method):
    recipe = _recipe(tmp_path, tiny_target_dir, distilled, method)
    summary = run_train(recipe)
    assert summary["steps"] == 4 and summary["best_tau_sim"] >= 1.0
    run = tmp_path / "run"
    target = load_target(recipe.target)
    ids = torch.randint(0, 250, (1, 14))
    trained = load_draft(run)
    assert trained.spec.name == method
    expected_loss, expected_tokens = _outputs(trained, target, ids)
    spec = METHODS[method]
    for fmt in spec.exports:
        out = export_draft(run, fmt, tmp_path / fmt, dtype="float32")
        config = json.loads((out / "config.json").read_text())
        tensors = load_file(out / EXPORT_FILE)
        cfg, draft = spec.from_export(config, tensors, DraftContext(target=target.info))
        for name, value in trained.draft.state_dict().items():
            assert torch.equal(draft.state_dict()[name], value), (fmt, name)
        reloaded = load_draft(out)
        loss, tokens = _outputs(reloaded, target, ids)
        torch.testing.assert_close(loss, expected_loss, msg=fmt)
        assert torch.equal(tokens, expected_tokens), fmt
    report = run_eval(tmp_path / "hf", tmp_path / "eval")
    assert report["lossless"] is True and report["settings"]["method"] == method
    runtime = load_runtime(tmp_path / "hf", RuntimeConfig(device="cpu", depth=3, topk=2, budget=6, max_len=128))
    prompt = ids[0, :8].tolist()
    expected = target.model.generate(ids[:, :8], attention_mask=torch.ones_like(ids[:, :8]), do_sample=False,
                                     max_new_tokens=16, min_new_tokens=16, eos_token_id=None, pad_token_id=0)
    assert runtime.engine.generate(prompt, 16).tokens == expected[0, 8:].tolist()


@pytest.mark.parametrize("method", sorted(ADDON_CASES))
def test_addon_method_makes_records_trains_exports_and_serves(tmp_path, tiny_target_dir, distilled, method):
    settings, records, counts = ADDON_CASES[method]
    base = train_base_export(tmp_path / "base", tiny_target_dir, distilled)
    prompts = write_prompts(tmp_path / "prompts.jsonl", records)
    recipe = addon_recipe(tmp_path, tiny_target_dir, method, {"draft": base, **settings}, prompts)
    runtime = run_addon_stages(tmp_path, recipe, counts)
    assert runtime.draft.spec.name == method
