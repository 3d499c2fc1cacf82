"""The contract every registered method keeps, on a tiny random target (CPU, seconds per method): it trains
through the real trainer, every export format reloads through `from_export` into a draft that computes the
same loss and drafts the same tokens, and the evaluator and the runtime decode losslessly with it. A method that
reads images (READS_IMAGES) keeps it on a tiny vision-language target, trained on image prompts, its drafts
checked on one, and its runtime lossless on image prompts too. An add-on method (MethodSpec.records, over a base
draft) keeps the same contract from its records: `distill-data` makes them (counted, resumed without rewriting a
shard), the trainer fits it, every export (its base inside) reloads into a draft with the same loss on them, and
the runtime, its drafter extending the base's, decodes losslessly (exact acceptance unless asked otherwise)."""
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from specdraft.config import RuntimeConfig

from specdraft.distill.run import run_distill
from specdraft.recipes import load_recipe
from specdraft.drafts import EXPORT_FILE, load_draft
from specdraft.eval.run import run_eval
from specdraft.export import export_draft
from specdraft.methods import METHODS
from specdraft.core.types import DraftBatch, DraftContext, TargetFeatures
from specdraft.runtime.load import load_runtime
from specdraft.decoding.tree import TreeShape
from specdraft.targets import capture_features, load_target
from specdraft.targets.vision import vision_features
from specdraft.train.trainer import run_train
from tests.addons import ADDON_METHODS, DRAFT_METHODS, addon_recipe, write_prompts
from tests.distilled import CHAT_PROMPTS
from tests.oracles import ChainState, chain_of
from tests.tiny_vlm import drawn_image

pytestmark = pytest.mark.reference_kernels

CASES = {  # small settings per method trained on the target's features; every registered method needs one
    "eagle3": {"ttt_steps": 3, "draft_vocab_size": 256},
    "poss": {"ttt_steps": 3, "draft_vocab_size": 256, "num_specialists": 2, "positions_per_specialist": 2},
    "kangaroo": {"ttt_steps": 3, "draft_vocab_size": 256, "exit_layer": 2},
    "vispec": {"ttt_steps": 3, "draft_vocab_size": 256, "num_queries": 3},
    "peagle": {"num_depths": 4, "draft_vocab_size": 256},
    "dflash": {"block_size": 4, "num_layers": 2, "num_anchors": 8},
}
READS_IMAGES = {"vispec"}  # trained and served on the tiny VLM (tiny_vlm_dir, distilled_images)
LABELS = [{"prefix": "ab", "candidate": "c", "label": 1}, {"prefix": "a", "candidate_id": 7, "label": 0}]
ADDON_CASES = {  # add-on methods trained on records of their own, over the chat-trained EAGLE-3 base: their
    # settings besides the base draft, the prompt records their data stage reads, and the counts those give
    "c2t": ({"trace_depth": 3, "trace_topk": 2}, [{"prompt": text} for text in CHAT_PROMPTS[:5]],
            {"input": 5, "ok": 5, "error": 0, "skipped": 0}),
    "judge": ({}, [{"prompt": text, "labels": LABELS} for text in CHAT_PROMPTS[:4]] +
              [{"prompt": "a label without its candidate", "labels": [{"prefix": "x", "label": 1}]}],
              {"input": 5, "ok": 4, "error": 1, "skipped": 0}),
}


def test_every_method_has_a_case():
    assert set(CASES) == set(DRAFT_METHODS) and set(ADDON_CASES) == set(ADDON_METHODS)
    assert set(ADDON_CASES) == {name for name, spec in METHODS.items() if spec.records is not None}


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
eval: {{prompts: {prompts}, max_new_tokens: 16, depth: 3}}
""")
    return load_recipe(path)


def _target_and_data(request, method: str):
    """(target directory, distilled directory) a method's contract runs on."""
    if method in READS_IMAGES:
        return request.getfixturevalue("tiny_vlm_dir"), request.getfixturevalue("distilled_images")
    return request.getfixturevalue("tiny_target_dir"), request.getfixturevalue("distilled")


def _probe(target):
    """(ids [1, T], images): random token ids for a text target; for a VLM, an image prompt then random text."""
    if target.processor is None:
        return torch.randint(0, 250, (1, 14)), []
    images = [drawn_image(7)]
    prompt = target.chat.ids([{"role": "user", "content": "<image>\nWhat is it?"}], images, True)
    return torch.tensor([prompt + torch.randint(0, 250, (10,)).tolist()]), images


def _features(target, ids, images, layers):
    if target.processor is None:
        return capture_features(target.model, ids, torch.ones_like(ids), layers)
    return vision_features(target.model, target.processor, ids, [images], layers)


def _outputs(loaded, target, probe):
    """(loss, drafted tokens) of a loaded draft on the probe's ids [1, T] (and images): what must survive an export."""
    spec, draft = loaded.spec, loaded.draft
    if spec.bind_target is not None:
        spec.bind_target(draft, target.model)
    ids, images = probe
    ones = torch.ones_like(ids)
    feats = _features(target, ids, images, spec.feature_layers(loaded.method_cfg, target.info))
    with torch.no_grad():
        loss = spec.loss(draft, DraftBatch(ids, ones, ones, feats), loaded.method_cfg).loss
    prefix = ids.shape[1] - 4
    state = ChainState(tokens=ids[:, :prefix + 1], embed=target.model.get_input_embeddings(),
                       features=TargetFeatures({i: h[:, :prefix] for i, h in feats.hidden_states.items()},
                                               context={k: v[:, :prefix] for k, v in feats.context.items()}),
                       lm_head=target.model.get_output_embeddings().weight)
    return loss, chain_of(spec.name)(draft, state, 3)


@pytest.mark.parametrize("method", sorted(CASES))
def test_method_trains_exports_reloads_and_decodes(request, tmp_path, method):
    target_dir, distilled = _target_and_data(request, method)
    recipe = _recipe(tmp_path, target_dir, distilled, method)
    summary = run_train(recipe)
    assert summary["steps"] == 4 and summary["best"] >= 1.0
    run = tmp_path / "run"
    target = load_target(recipe.target)
    probe = _probe(target)
    ids = probe[0]
    trained = load_draft(run)
    assert trained.spec.name == method
    expected_loss, expected_tokens = _outputs(trained, target, probe)
    spec = METHODS[method]
    for fmt in spec.exports:
        out = export_draft(run, fmt, tmp_path / fmt, dtype="float32")
        config = json.loads((out / "config.json").read_text())
        tensors = load_file(out / EXPORT_FILE)
        cfg, draft = spec.from_export(config, tensors, DraftContext(target=target.info))
        for name, value in trained.draft.state_dict().items():
            assert torch.equal(draft.state_dict()[name], value), (fmt, name)
        reloaded = load_draft(out)
        loss, tokens = _outputs(reloaded, target, probe)
        torch.testing.assert_close(loss, expected_loss, msg=fmt)
        assert torch.equal(tokens, expected_tokens), fmt
    report = run_eval(tmp_path / "hf", tmp_path / "eval")
    assert report["lossless"] is True and report["settings"]["method"] == method
    runtime = load_runtime(tmp_path / "hf", RuntimeConfig(device="cpu", depth=3, topk=2, budget=6, max_len=128))
    prompt = ids[0, :8].tolist()
    expected = target.model.generate(ids[:, :8], attention_mask=torch.ones_like(ids[:, :8]), do_sample=False,
                                     max_new_tokens=16, min_new_tokens=16, eos_token_id=None, pad_token_id=0)
    assert runtime.engine.generate(prompt, 16).tokens == expected[0, 8:].tolist()
    if method in READS_IMAGES:  # an image prompt the draft never saw: speculative equals plain decoding
        image_prompt = runtime.prompt("<image>\nWhat is in this one?", [drawn_image(8, (48, 32))])
        kwargs = image_prompt.engine_kwargs()
        assert runtime.engine.generate(image_prompt.ids, 16, **kwargs).tokens == \
            runtime.engine.decode_plain(image_prompt.ids, 16, **kwargs).tokens


def _record_loss(loaded, batch):
    with torch.no_grad():
        return loaded.spec.loss(loaded.draft, batch, loaded.method_cfg).loss


def _distill_counted_and_resumed(recipe, records_dir, counts):
    """distill-data's counts, then a second run that resumes: no shard rewritten."""
    assert run_distill(recipe, device="cpu") == counts
    assert json.loads((records_dir / "counts.json").read_text()) == counts
    shards = sorted((records_dir / "shards").iterdir())
    written = [shard.stat().st_mtime for shard in shards]
    run_distill(recipe, device="cpu")
    assert [shard.stat().st_mtime for shard in shards] == written


@pytest.mark.parametrize("method", sorted(ADDON_CASES))
def test_addon_method_trains_on_its_records_exports_reloads_and_decodes(tmp_path, tiny_target_dir, chat_base_export,
                                                                        method):
    from datasets import load_from_disk

    settings, records, counts = ADDON_CASES[method]
    prompts = write_prompts(tmp_path / "prompts.jsonl", records)
    recipe = load_recipe(addon_recipe(tmp_path, tiny_target_dir, method, {"draft": chat_base_export, **settings},
                                      prompts))
    _distill_counted_and_resumed(recipe, tmp_path / "records", counts)
    assert run_train(recipe)["steps"] == 3
    spec = METHODS[method]
    batch = spec.records.collate(list(load_from_disk(str(tmp_path / "records" / "dataset")).with_format("numpy")))
    trained = load_draft(tmp_path / "run")
    assert trained.spec.name == method and trained.base.source == str(chat_base_export)
    expected_loss = _record_loss(trained, batch)
    target = load_target(recipe.target)
    for fmt in spec.exports:
        out = export_draft(tmp_path / "run", fmt, tmp_path / fmt, dtype="float32")
        assert (out / "draft" / EXPORT_FILE).is_file()  # the base inside: one directory serves
        hidden = tmp_path / "base-moved"
        shutil.move(str(chat_base_export), str(hidden))  # the export reads its own copy of the base
        try:
            reloaded = load_draft(out)
        finally:
            shutil.move(str(hidden), str(chat_base_export))
        for name, value in trained.draft.state_dict().items():
            assert torch.equal(reloaded.draft.state_dict()[name], value), (fmt, name)
        torch.testing.assert_close(_record_loss(reloaded, batch), expected_loss, msg=fmt)
        for shape in (dict(depth=3, topk=2, budget=6), dict(depth=3, chain=True)):
            runtime = load_runtime(out, RuntimeConfig(device="cpu", dtype="float32", max_len=128, **shape))
            prompt = runtime.encode_chat(CHAT_PROMPTS[0])
            expected = target.model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=12,
                                             min_new_tokens=12, eos_token_id=None, pad_token_id=0)
            assert runtime.engine.generate(prompt, 12).tokens == expected[0, len(prompt):].tolist(), (fmt, shape)
