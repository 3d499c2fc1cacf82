"""Tiny random vision-language targets of each family specdraft loads (LLaVA 1.5, LLaVA-NeXT, Idefics3, Qwen2.5-VL),
saved as Hugging Face directories with their processors (slow PIL image processors: no torchvision here), and
drawn test images. Qwen2.5-VL's processor cannot be built without torchvision (its video processor), so
`tiny_processor` builds it in memory for tests that hand it to the loader."""
from __future__ import annotations

from pathlib import Path

import torch

from specdraft.testing.tiny import byte_tokenizer

FAMILIES = ("llava", "llava_next", "idefics3", "qwen2_5_vl")
IMAGE_TOKENS = {"llava": ["<image>"], "llava_next": ["<image>"],
                "idefics3": ["<fake_token_around_image>", "<image>", "<global-img>"],
                "qwen2_5_vl": ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>"]}
IMAGE_TEXT = {"llava": "<image>", "llava_next": "<image>", "idefics3": "<image>",
              "qwen2_5_vl": "<|vision_start|><|image_pad|><|vision_end|>"}


def chat_template(image_text: str) -> str:
    """ChatML over string or content-part contents, an image part written as `image_text`."""
    return ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
            "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
            "{% for part in message['content'] %}{% if part['type'] == 'image' %}" + image_text +
            "{% else %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def vlm_tokenizer(family: str):
    tokenizer = byte_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>", *IMAGE_TOKENS[family]]})
    return tokenizer


def _text_config(tokenizer, cls_name: str = "LlamaConfig", **extra):
    import transformers

    config = getattr(transformers, cls_name)(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=1024, rms_norm_eps=1e-5, tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None, **extra)
    return config


def _llava(tokenizer):
    from transformers import LlavaConfig, LlavaForConditionalGeneration, SiglipVisionConfig

    vision = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                image_size=32, patch_size=8)
    config = LlavaConfig(vision_config=vision, text_config=_text_config(tokenizer), vision_feature_layer=-1,
                         vision_feature_select_strategy="full", image_token_id=tokenizer.convert_tokens_to_ids("<image>"))
    return LlavaForConditionalGeneration(config)


PINPOINTS = [[32, 32], [32, 64], [64, 32]]


def _llava_next(tokenizer):
    from transformers import CLIPVisionConfig, LlavaNextConfig, LlavaNextForConditionalGeneration

    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                              image_size=32, patch_size=8, projection_dim=32)
    config = LlavaNextConfig(vision_config=vision, text_config=_text_config(tokenizer), vision_feature_layer=-1,
                             image_grid_pinpoints=PINPOINTS, image_token_id=tokenizer.convert_tokens_to_ids("<image>"))
    return LlavaNextForConditionalGeneration(config)


def _idefics3(tokenizer):
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration

    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
              "image_size": 32, "patch_size": 8}
    config = Idefics3Config(vision_config=vision, text_config=_text_config(tokenizer), scale_factor=2,
                            image_token_id=tokenizer.convert_tokens_to_ids("<image>"))
    return Idefics3ForConditionalGeneration(config)


def _qwen2_5_vl(tokenizer):
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in IMAGE_TOKENS["qwen2_5_vl"]}
    text = {"vocab_size": len(tokenizer), "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
            "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 1024, "rms_norm_eps": 1e-5,
            "rope_parameters": {"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0},
            "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id, "bos_token_id": None,
            "tie_word_embeddings": False}
    vision = {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 64,
              "patch_size": 8, "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 32,
              "fullatt_block_indexes": [0]}
    config = Qwen2_5_VLConfig(text_config=text, vision_config=vision, image_token_id=ids["<|image_pad|>"],
                              video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
                              vision_end_token_id=ids["<|vision_end|>"], tie_word_embeddings=False,
                              eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    return Qwen2_5_VLForConditionalGeneration(config)


def tiny_processor(family: str, tokenizer=None):
    """The family's processor over the tiny tokenizer (slow PIL image processors)."""
    import transformers as hf

    tokenizer = tokenizer or vlm_tokenizer(family)
    template = chat_template(IMAGE_TEXT[family])
    if family == "llava":
        images = hf.SiglipImageProcessorPil(size={"height": 32, "width": 32})
        return hf.LlavaProcessor(image_processor=images, tokenizer=tokenizer, patch_size=8,
                                 vision_feature_select_strategy="full", chat_template=template)
    if family == "llava_next":
        images = hf.LlavaNextImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32},
                                               image_grid_pinpoints=PINPOINTS)
        return hf.LlavaNextProcessor(image_processor=images, tokenizer=tokenizer, patch_size=8,
                                     vision_feature_select_strategy="default", chat_template=template,
                                     num_additional_image_tokens=1)
    if family == "idefics3":
        images = hf.Idefics3ImageProcessorPil(size={"longest_edge": 64}, max_image_size={"longest_edge": 32})
        return hf.Idefics3Processor(image_processor=images, tokenizer=tokenizer, image_seq_len=4,
                                    chat_template=template)
    images = hf.Qwen2VLImageProcessorPil(patch_size=8, merge_size=2, temporal_patch_size=2, min_pixels=32 * 32,
                                         max_pixels=64 * 64)
    original = hf.ProcessorMixin.check_argument_for_proper_class
    hf.ProcessorMixin.check_argument_for_proper_class = lambda self, *args, **kwargs: None  # no video processor
    try:
        return hf.Qwen2_5_VLProcessor(image_processor=images, tokenizer=tokenizer, chat_template=template)
    finally:
        hf.ProcessorMixin.check_argument_for_proper_class = original


BUILDERS = {"llava": _llava, "llava_next": _llava_next, "idefics3": _idefics3, "qwen2_5_vl": _qwen2_5_vl}


def tiny_vlm(family: str, seed: int = 0):
    """(model, processor) of a tiny random VLM of `family`, its LM head scaled so that greedy text is peaked."""
    tokenizer = vlm_tokenizer(family)
    torch.manual_seed(seed)
    model = BUILDERS[family](tokenizer).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(40.0)
    return model, tiny_processor(family, tokenizer)


def save_tiny_vlm(directory: Path, family: str = "llava", seed: int = 0) -> Path:
    """A tiny random VLM saved as a Hugging Face directory with its processor (Qwen2.5-VL: its tokenizer and
    image processor only; see the module docstring)."""
    model, processor = tiny_vlm(family, seed)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    if family == "qwen2_5_vl":
        processor.tokenizer.save_pretrained(directory)
        processor.image_processor.save_pretrained(directory)
    else:
        processor.save_pretrained(directory)
    return directory


def drawn_image(seed: int, size=(40, 30)):
    """A small RGB image of random coloured blocks (PIL)."""
    from PIL import Image

    generator = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (3, 4, 4), generator=generator, dtype=torch.uint8)
    pixels = blocks.repeat_interleave(size[1] // 4 + 1, 1).repeat_interleave(size[0] // 4 + 1, 2)
    return Image.fromarray(pixels[:, :size[1], :size[0]].permute(1, 2, 0).numpy())
