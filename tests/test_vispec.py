"""ViSpec (CPU, float32, tiny random VLMs built in the test): where images go in the draft's sequence; its runtime
drafter on image prompts drafts what the training side drafts and decodes losslessly (chains, trees, padded
prefills, a text prompt after an image one); and the whole path distill-data -> train -> export -> runtime on an
image prompt set with one broken image."""
import functools
import json

import pytest
import torch

from specdraft import cli
from specdraft.config import RuntimeConfig
from specdraft.core.types import IMAGE_MASK, DraftBatch, DraftContext, TargetInfo
from specdraft.decoding.engine import SpecEngine
from specdraft.decoding.verifier import from_hf, hf_rope_tables
from specdraft.decoding.tree import TreeShape
from specdraft.methods import METHODS
from specdraft.methods.vispec import draft_columns, vispec_unroll
from specdraft.methods.vispec.model import column_maps, image_spans, kept_columns
from specdraft.runtime.load import load_runtime
from specdraft.targets.chat import VisionChat
from specdraft.targets.vision import image_model_inputs, image_prompt, vision_features
from tests.oracles import ChainState, vispec_chain, vispec_prefix_step
from tests.test_distill_images import image_prompt_sets
from tests.tiny_vlm import drawn_image, save_tiny_vlm, tiny_vlm

pytestmark = pytest.mark.reference_kernels


def test_each_image_keeps_its_last_positions_as_stand_ins_and_lends_its_global_feature_to_what_follows():
    mask = torch.tensor([[0, 1, 1, 1, 1, 0, 0, 1, 0], [0, 0, 0, 0, 0, 0, 0, 0, 0]], dtype=torch.bool)
    spans = image_spans(mask)
    assert (spans.rows.tolist(), spans.starts.tolist(), spans.ends.tolist()) == ([0, 0], [1, 7], [5, 8])
    maps = column_maps(mask, spans, num_queries=3)  # two stand-ins an image: outputs 0 and 1, global 2
    # an image's columns: those whose next token is one of its tokens (0..3, then 6); the column at its last
    # position (4, then 7) is text and reads its global feature
    assert maps.kept[0].tolist() == [0, 0, 1, 1, 1, 1, 1, 1, 1] and maps.kept[1].all()
    assert maps.standin[0].tolist() == [-1, -1, 0, 1, -1, -1, 4, -1, -1]  # a one-token image: its last stand-in
    assert maps.global_feature[0].tolist() == [-1] * 4 + [2, 2, 2, 5, 5]
    index, valid = kept_columns(maps.kept)
    assert index[0].tolist() == [2, 3, 4, 5, 6, 7, 8, 0, 0] and valid.sum(1).tolist() == [7, 9]


def _hf_greedy(model, processor, ids, images, n):
    inputs = image_model_inputs(processor, model, torch.tensor([ids]), [images])
    out = model.generate(**inputs, attention_mask=torch.ones(1, len(ids), dtype=torch.long), do_sample=False,
                         max_new_tokens=n, min_new_tokens=n, eos_token_id=None, pad_token_id=0)
    return out[0, len(ids):].tolist()


def _features(model, processor, ids, images, layers):
    return vision_features(model, processor, torch.tensor([ids]), [images], layers)


def image_ids(processor, images, text="<image>\nWhat is in it?"):
    return VisionChat(processor).ids([{"role": "user", "content": text}], images, add_generation_prompt=True)


def vlm_info(model):
    return TargetInfo.from_hf_config(model.config, "tiny")


@functools.lru_cache(maxsize=None)
def memorised_vlm_draft():
    """A tiny LLaVA, an image prompt and the target's continuation, and a ViSpec draft (3 queries) fitted to it."""
    model, processor = tiny_vlm("llava", seed=1)
    info, spec = vlm_info(model), METHODS["vispec"]
    cfg = spec.config(draft_vocab_size=200, init_std=0.3, ttt_steps=4, num_queries=3)
    images = [drawn_image(5)]
    prompt = image_ids(processor, images)
    sequence = prompt + _hf_greedy(model, processor, prompt, images, 28)
    counts = torch.randint(0, 50, (info.vocab_size,)) + 1000 * torch.bincount(torch.tensor(sequence),
                                                                              minlength=info.vocab_size)
    draft = spec.build(cfg, DraftContext(info, counts))
    feats = _features(model, processor, sequence, images, spec.feature_layers(cfg, info))
    ids, ones = torch.tensor([sequence]), torch.ones(1, len(sequence), dtype=torch.long)
    optimizer = torch.optim.AdamW(draft.parameters(), lr=1e-2)
    with torch.enable_grad():
        for _ in range(15):
            loss = spec.loss(draft, DraftBatch(ids, ones, ones, feats), cfg).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return model, processor, spec, cfg, draft.eval(), prompt, images


def _engine(shape, max_len=256):
    model, processor, spec, cfg, draft, prompt, images = memorised_vlm_draft()
    target = from_hf(model, vlm_info(model))
    return SpecEngine(target, spec.runtime(draft, cfg, target), shape, max_len, hf_rope_tables(model, max_len))


def test_a_batch_in_the_draft_s_columns_replaces_each_image_by_its_stand_ins():
    model, processor, spec, cfg, draft, prompt, images = memorised_vlm_draft()
    feats = _features(model, processor, prompt, images, spec.feature_layers(cfg, vlm_info(model)))
    ones = torch.ones(1, len(prompt), dtype=torch.long)
    columns = draft_columns(draft, DraftBatch(torch.tensor([prompt]), ones, ones, feats))
    image_tokens = int(feats.context[IMAGE_MASK].sum())
    assert image_tokens == 16 and columns.batch.input_ids.shape[1] == len(prompt)  # the batch keeps its width
    assert int(columns.batch.attention_mask.sum()) == len(prompt) - image_tokens + 2  # two stand-ins an image
    assert int(columns.standin_mask.sum()) == 2
    positions = columns.batch.position_ids[0].tolist()
    start = feats.context[IMAGE_MASK][0].int().argmax().item()
    # the stand-ins keep the positions of the span's last columns (the columns whose next token is the image's);
    # the image's last position, the first text column after them, reads the global feature
    assert positions[start - 2:start + 2] == [start - 2, start + 13, start + 14, start + 15]
    assert columns.global_features[0, :start + 1].abs().sum() == 0
    assert columns.global_features[0, start + 1:len(prompt) - 14].abs().sum(-1).min() > 0


@torch.no_grad()
def test_training_s_first_step_reads_each_column_s_next_token_as_the_runtime_does():
    """Dropped image columns must not change which token a kept column reads in training's step 0: the runtime's
    drafter (the oracle here) reads the token after each column's position."""
    model, processor, spec, cfg, draft, prompt, images = memorised_vlm_draft()
    sequence = prompt + _hf_greedy(model, processor, prompt, images, 4)
    n = len(sequence) - 1
    feats = _features(model, processor, sequence[:n], images, spec.feature_layers(cfg, vlm_info(model)))
    ones = torch.ones(1, n, dtype=torch.long)
    columns = draft_columns(draft, DraftBatch(torch.tensor([sequence[:n]]), ones, ones, feats))
    kept = int(columns.batch.attention_mask.sum())
    trained = next(vispec_unroll(draft, columns.batch.features.hidden_states, 1, columns.batch.position_ids,
                                 logits=False, columns=columns))  # [1, n, H]
    state = ChainState(tokens=torch.tensor([sequence]), features=feats, embed=model.get_input_embeddings())
    # the last column's next token is past the batch (training has no loss there)
    torch.testing.assert_close(trained[:, :kept - 1], vispec_prefix_step(draft, state)[0][:, :-1])


@pytest.mark.parametrize("context", ["image target", "text target"])
def test_a_batch_without_images_keeps_every_weight_in_the_graph_with_zero_adaptor_gradients(context):
    """DDP and ZeRO reduce every parameter's gradient: a batch with no image (a text prompt to the VLM, or a text
    target's batch without image context) still reaches the adaptor, and changes nothing it computes."""
    model, processor, spec, cfg, _, _, _ = memorised_vlm_draft()
    info = vlm_info(model)
    draft = spec.build(cfg, DraftContext(info, torch.ones(info.vocab_size, dtype=torch.long)))
    text = image_ids(processor, [], "no image here, only words")
    feats = _features(model, processor, text, [], spec.feature_layers(cfg, info))
    if context == "text target":
        feats.context = {}
    ones = torch.ones(1, len(text), dtype=torch.long)
    batch = DraftBatch(torch.tensor([text]), ones, ones, feats)
    with torch.enable_grad():
        spec.loss(draft, batch, cfg).loss.backward()
    missing = [name for name, p in draft.named_parameters() if p.requires_grad and p.grad is None]
    assert missing == []
    assert all(p.grad.abs().sum() == 0 for p in draft.image_adaptor.parameters())
    with torch.enable_grad():
        anchored = draft_columns(draft, batch).global_features
    with torch.no_grad():
        assert torch.equal(anchored.detach(), draft_columns(draft, batch).global_features)


@torch.no_grad()
def test_the_runtime_drafter_drafts_what_the_training_side_drafts_on_an_image_prompt():
    model, processor, spec, cfg, draft, prompt, images = memorised_vlm_draft()
    engine = _engine(TreeShape.chain(4))
    inputs = image_prompt(model, processor, prompt, images, 256)
    result = engine.generate(prompt, 20, trace=True, **inputs.engine_kwargs())
    layers = spec.feature_layers(cfg, vlm_info(model))
    emitted = 1
    for cycle, row in enumerate(result.trace):
        confirmed = prompt + result.tokens[:emitted]
        feats = _features(model, processor, confirmed[:-1], images, layers)
        state = ChainState(tokens=torch.tensor([confirmed]), features=feats, embed=model.get_input_embeddings())
        assert row["tokens"][1:] == vispec_chain(draft, state, 4).tolist(), f"cycle {cycle}"
        emitted += result.accepted[cycle] + 1
    assert sum(result.accepted) > 0


@torch.no_grad()
def test_a_cycle_s_ingest_writes_what_the_prompt_s_tables_would():
    """`ingest` (rows after the prompt: slots shifted by the dropped image columns, img_fc split onto the last
    image's global term) leaves the drafter's caches and state as `ingest_prompt`'s per-slot tables do."""
    model, processor, spec, cfg, draft, prompt, images = memorised_vlm_draft()
    engine = _engine(TreeShape.chain(4))
    inputs = image_prompt(model, processor, prompt, images, 256)
    engine.generate(prompt, 4, **inputs.engine_kwargs())  # begin + prefill: the tables of this prompt
    drafter = engine.drafter
    assert int(drafter.shift) > 0  # the image's columns were dropped
    rows, count = 5, torch.tensor([3])
    generator = torch.Generator().manual_seed(0)
    hidden = model.config.text_config.hidden_size
    features = {i: torch.randn(rows, hidden, generator=generator) for i in drafter.feature_layers}
    next_tokens = torch.randint(0, model.config.text_config.vocab_size, (rows,), generator=generator)
    start = torch.tensor([len(prompt) + 2])
    drafter.prefix_len.copy_(start - drafter.shift)
    saved = [t.clone() for t in drafter.state_tensors()]
    drafter.ingest(features, next_tokens, start, count)
    fast = [t.clone() for t in drafter.state_tensors()]
    for tensor, value in zip(drafter.state_tensors(), saved):
        tensor.copy_(value)
    drafter.ingest_prompt(features, next_tokens, start, count)
    for got, expected in zip(fast, drafter.state_tensors()):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    assert not torch.equal(fast[0], saved[0])  # the keys were written


@pytest.mark.parametrize("shape", [TreeShape.chain(5), TreeShape(depth=4, topk=3, budget=10)], ids=["chain", "tree"])
@torch.no_grad()
def test_image_prompts_decode_losslessly_and_a_padded_prefill_changes_nothing(shape):
    model, processor, spec, cfg, draft, prompt, images = memorised_vlm_draft()
    engine = _engine(shape)
    inputs = image_prompt(model, processor, prompt, images, 256)
    expected = engine.decode_plain(prompt, 20, **inputs.engine_kwargs()).tokens
    assert expected == _hf_greedy(model, processor, prompt, images, 20)
    exact = engine.generate(prompt, 20, trace=True, **inputs.engine_kwargs())
    engine.prefill_rows = 16  # as CUDA graphs pad the prompt
    padded = engine.generate(prompt, 20, trace=True, **inputs.engine_kwargs())
    assert exact.tokens == padded.tokens == expected and exact.accepted == padded.accepted
    assert sum(exact.accepted) > 0
    if shape.topk == 1:
        return
    other = [drawn_image(9, (50, 40))]  # an image the draft never saw, then a text prompt: the tables follow
    other_prompt = image_ids(processor, other, "Describe <image> please")
    other_inputs = image_prompt(model, processor, other_prompt, other, 256)
    assert engine.generate(other_prompt, 12, **other_inputs.engine_kwargs()).tokens == \
        _hf_greedy(model, processor, other_prompt, other, 12)
    text = image_ids(processor, [], "no image")
    assert engine.generate(text, 12).tokens == _hf_greedy(model, processor, text, [], 12)


def test_distill_train_export_and_serve_an_image_prompt_set(tmp_path):
    target = save_tiny_vlm(tmp_path / "vlm", "llava")
    prompts = image_prompt_sets(tmp_path / "prompts")
    recipe = tmp_path / "vispec.yaml"
    recipe.write_text(f"""
target: {{path: {target}, dtype: float32}}
method: {{name: vispec, ttt_steps: 3, draft_vocab_size: 256}}
data: {{prompts: {json.dumps(prompts)}, max_length: 256, val_fraction: 0.2}}
distill: {{output_dir: {tmp_path / 'data'}, max_new_tokens: 12, batch_size: 4, shard_size: 4,
          answer_instruction: Please answer at length.}}
train: {{output_dir: {tmp_path / 'run'}, max_steps: 3, micro_batch_size: 2, val_every_steps: 3, lr: 3.0e-3,
         warmup_steps: 1, log_every_steps: 1}}
""")
    assert cli.main(["distill-data", str(recipe)]) == 0
    counts = json.loads((tmp_path / "data" / "counts.json").read_text())
    assert counts == {"input": 7, "ok": 5, "error": 2, "skipped": 0}  # one missing, one corrupt image
    assert cli.main(["train", str(recipe)]) == 0
    assert cli.main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "export"), "--dtype", "float32"]) == 0
    config = json.loads((tmp_path / "export" / "config.json").read_text())
    assert config["architectures"] == ["VispecEagle3Draft"] and config["specdraft"]["method"] == "vispec"
    runtime = load_runtime(tmp_path / "export", RuntimeConfig(device="cpu", dtype="float32", depth=3, topk=2,
                                                              budget=6, max_len=256))
    engine = runtime.engine
    for image in (drawn_image(11), drawn_image(12, (64, 48))):
        prompt = runtime.prompt("<image>\nWhat do you see?", [image])
        spec = engine.generate(prompt.ids, 16, runtime.eos_ids, **prompt.engine_kwargs())
        assert spec.tokens == engine.decode_plain(prompt.ids, 16, runtime.eos_ids, **prompt.engine_kwargs()).tokens
    image_file = tmp_path / "prompts" / "imgs" / "2.png"
    assert cli.main(["generate", str(tmp_path / "export"), "--prompt", "<image>\nWhat is it?", "--image",
                     str(image_file), "--max-new-tokens", "6", "--device", "cpu"]) == 0
    llava_set = prompts[1]  # the evaluator and the bench read the image prompt set's images too
    assert cli.main(["eval", str(tmp_path / "export"), f"eval.prompts={llava_set}", "eval.max_new_tokens=8",
                     "eval.depth=3", "eval.device=cpu"]) == 0
    assert json.loads((tmp_path / "export" / "eval.json").read_text())["lossless"] is True
    assert cli.main(["bench", str(tmp_path / "export"), "--prompts", llava_set, "--max-new-tokens", "8",
                     "--temperature", "0", "--device", "cpu", "--out", str(tmp_path / "bench")]) == 0
    bench = json.loads((tmp_path / "bench" / "bench.json").read_text())
    assert bench["lossless_float32"] is True and bench["runs"][0]["plain_matches_hf_prompts"] == 2
