"""On a GPU: ViSpec's drafter on image prompts (its per-slot image tables filled before each prefill, outside the
captured graphs) gives the same tokens and acceptance in the CUDA-graphed engine as in the eager one, an image
prompt after another and a text prompt after both included, and (fp32) plain decoding's output."""
import copy

import pytest
import torch

from specdraft.decoding.engine import SpecEngine
from specdraft.decoding.verifier import from_hf, hf_rope_tables
from specdraft.decoding.tree import TreeShape
from specdraft.targets.vision import image_prompt
from tests.test_vispec import image_ids, memorised_vlm_draft, vlm_info
from tests.tiny_vlm import drawn_image

pytestmark = [pytest.mark.gpu, pytest.mark.reference_kernels]


def _engines(dtype, shape, max_len=256):
    """(eager engine, graphed engine, the VLM on the GPU, its processor, the fitted prompt and its images)."""
    model, processor, spec, cfg, draft, prompt, images = memorised_vlm_draft()
    model = copy.deepcopy(model).to("cuda", dtype)  # the CPU copies stay the CPU tests'
    draft = copy.deepcopy(draft).to("cuda", dtype)
    engines = []
    for use_graphs in (False, True):
        target = from_hf(model, vlm_info(model))
        engines.append(SpecEngine(target, spec.runtime(draft, cfg, target), shape, max_len,
                                  hf_rope_tables(model, max_len), use_graphs))
    return (*engines, model, processor, prompt, images)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [TreeShape.chain(5), TreeShape(depth=4, topk=3, budget=10)], ids=["chain", "tree"])
@torch.no_grad()
def test_graphed_vispec_engine_equals_eager_on_image_prompts(dtype, shape):
    eager, graphed, model, processor, prompt, images = _engines(dtype, shape)
    other = [drawn_image(9, (50, 40))]
    prompts = [(prompt, images), (image_ids(processor, other, "Describe <image> please"), other),
               (image_ids(processor, [], "no image"), [])]
    for ids, pictures in prompts * 2:  # the second pass replays the captured graphs
        kwargs = image_prompt(model, processor, ids, pictures, eager.max_len).engine_kwargs() if pictures else {}
        expected, got = eager.generate(ids, 24, **kwargs), graphed.generate(ids, 24, **kwargs)
        assert got.tokens == expected.tokens and got.accepted == expected.accepted
        if dtype == torch.float32:
            assert expected.tokens == eager.decode_plain(ids, 24, **kwargs).tokens
            assert ids is not prompt or sum(got.accepted) > 0  # the fitted prompt: its drafts are accepted
