"""Vision-language targets (CPU, float32, tiny random VLMs of each family built in the test): they load as targets
with their processors, their training features with images in the prompt are the model's own, and the runtime
decodes image prompts exactly as Hugging Face `generate` does, speculative decoding included."""
import pytest
import torch

from specdraft.config import TargetConfig
from specdraft.core.types import IMAGE_EMBEDS, IMAGE_MASK
from specdraft.decoding.engine import SpecEngine
from specdraft.decoding.verifier import from_hf, hf_rope_tables
from specdraft.decoding.tree import TreeShape
from specdraft.targets import load_target
from specdraft.targets import load as target_load
from specdraft.targets.vision import image_model_inputs, image_prompt, vision_features, with_image_parts
from tests.runtime.oracle import OracleDrafter
from tests.tiny_vlm import FAMILIES, drawn_image, save_tiny_vlm, tiny_processor

pytestmark = pytest.mark.reference_kernels


@pytest.fixture(scope="module")
def vlm_dirs(tmp_path_factory):
    return {family: save_tiny_vlm(tmp_path_factory.mktemp(family), family) for family in FAMILIES}


def _load(vlm_dirs, family, monkeypatch):
    if family == "qwen2_5_vl":  # its processor needs torchvision to load from disk (tests/tiny_vlm.py)
        monkeypatch.setattr(target_load, "load_processor", lambda *args: tiny_processor(family))
    return load_target(TargetConfig(path=str(vlm_dirs[family]), dtype="float32"))


def _image_ids(target, images, text="<image>\nWhat is in it?"):
    return target.chat.ids([{"role": "user", "content": text}], images, add_generation_prompt=True)


def _hf_greedy(target, ids, images, n):
    inputs = image_model_inputs(target.processor, target.model, torch.tensor([ids]), [images])
    out = target.model.generate(**inputs, attention_mask=torch.ones(1, len(ids), dtype=torch.long), do_sample=False,
                                max_new_tokens=n, min_new_tokens=n, eos_token_id=None, pad_token_id=0)
    return out[0, len(ids):].tolist()


def test_image_placeholders_become_content_parts():
    image, other = object(), object()
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "<image>\nWhat is it?"},
                {"role": "assistant", "content": ""}]
    parts = with_image_parts(messages, [image])
    assert parts[1]["content"] == [{"type": "image", "image": image}, {"type": "text", "text": "What is it?"}]
    assert parts[0]["content"] == [{"type": "text", "text": "be brief"}] and parts[2]["content"] == []
    unplaced = with_image_parts([{"role": "user", "content": "compare"}], [image, other])
    assert [p["type"] for p in unplaced[0]["content"]] == ["image", "image", "text"]


@pytest.mark.parametrize("family", FAMILIES)
def test_a_vlm_loads_as_a_target_and_its_features_are_the_models(vlm_dirs, family, monkeypatch):
    target = _load(vlm_dirs, family, monkeypatch)
    assert target.processor is not None and target.info.num_layers == 4 and target.info.hidden_size == 64
    images = [drawn_image(1), drawn_image(2, (30, 50))]
    rows = [_image_ids(target, images[:1]), _image_ids(target, images[1:], "<image>\nAnd this?")]
    width = max(map(len, rows))
    input_ids = torch.tensor([row + [0] * (width - len(row)) for row in rows])  # right-padded
    features = vision_features(target.model, target.processor, input_ids, [images[:1], images[1:]], [2, 4])
    for row, ids in enumerate(rows):  # each row alone through the whole model, as Hugging Face runs it
        inputs = image_model_inputs(target.processor, target.model, torch.tensor([ids]), [images[row:row + 1]])
        expected = target.model(**inputs, output_hidden_states=True)
        n = len(ids)
        torch.testing.assert_close(features.hidden_states[2][row, :n], expected.hidden_states[2][0])
        logits = features.final_hidden[row, :n] @ features.lm_head.T
        torch.testing.assert_close(logits, expected.logits[0], atol=1e-4, rtol=1e-4)
        mask = features.context[IMAGE_MASK][row, :n]
        assert 0 < int(mask.sum()) < n
        torch.testing.assert_close(features.context[IMAGE_EMBEDS][row, :n], expected.hidden_states[0][0])
        table = target.model.get_input_embeddings()(torch.tensor(ids))
        torch.testing.assert_close(features.hidden_states[0][row, :n], table)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_runtime_decodes_image_prompts_as_generate_does(vlm_dirs, family, monkeypatch):
    target = _load(vlm_dirs, family, monkeypatch)
    images = [drawn_image(3)]
    ids = _image_ids(target, images)
    expected = _hf_greedy(target, ids, images, 16)
    max_len = 256
    prompt = image_prompt(target.model, target.processor, ids, images, max_len)
    assert (prompt.rope is not None) == (family == "qwen2_5_vl")  # M-RoPE: the prompt's own rotary tables
    drafter = OracleDrafter(ids + expected, target.info.vocab_size, wrong_every=3)
    engine = SpecEngine(from_hf(target.model, target.info), drafter, TreeShape(depth=3, topk=2, budget=7), max_len,
                        hf_rope_tables(target.model, max_len))
    assert engine.decode_plain(ids, 16, **prompt.engine_kwargs()).tokens == expected
    result = engine.generate(ids, 16, **prompt.engine_kwargs())
    assert result.tokens == expected and sum(result.accepted) > 0
    text_ids = target.chat.ids([{"role": "user", "content": "no image here"}], add_generation_prompt=True)
    text_expected = _hf_greedy(target, text_ids, [], 8)  # the default tables come back after an image prompt
    assert engine.decode_plain(text_ids, 8).tokens == text_expected
