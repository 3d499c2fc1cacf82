"""Hierarchical drafting (decoding/hierarchy.py) on tiny random targets, CPU, fp32, PyTorch references: the target
verifies only the chain the small model keeps of each tree, and the output is the target's greedy output whatever
the small model is (the target itself, an unrelated model, a Kangaroo adapter), on a float and an int4 target."""
import copy

import pytest
import torch

from specdraft.core.errors import SpecdraftError
from specdraft.core.types import TargetInfo
from specdraft.decoding.engine import SpecEngine
from specdraft.decoding.hierarchy import CompactIntermediate
from specdraft.decoding.verifier import from_hf, hf_rope_tables
from specdraft.decoding.tree import TreeShape
from specdraft.layers.quantized import quantize_decoder
from tests.runtime.oracle import OracleDrafter
from tests.runtime.drafts import hf_greedy, tiny_hf
from tests.runtime.drafts import PROMPT, trained_case

SHAPE = TreeShape(depth=4, topk=2, budget=9)


def _engine(model, drafter, small, shape=SHAPE, max_len=128):
    info = TargetInfo.from_hf_config(model.config, "tiny")
    intermediate = None if small is None else CompactIntermediate(from_hf(small, info), hf_rope_tables(small, max_len))
    return SpecEngine(from_hf(model, info), drafter, shape, max_len, hf_rope_tables(model, max_len),
                      intermediate=intermediate)


@pytest.mark.parametrize("small_kind", ["itself", "unrelated"])
@torch.no_grad()
def test_lossless_whatever_the_small_model(small_kind):
    model = tiny_hf("llama")
    prompt = torch.randint(0, 300, (11,), generator=torch.Generator().manual_seed(1)).tolist()
    greedy = hf_greedy(model, prompt, 24)
    small = model if small_kind == "itself" else tiny_hf("llama_tied")
    result = _engine(model, OracleDrafter(prompt + greedy, 320, wrong_every=3), small).generate(prompt, 20,
                                                                                               trace=True)
    assert result.tokens == greedy[:20]
    assert all(len(row["tokens"]) == SHAPE.depth + 1 for row in result.trace)  # the target verified chains
    if small_kind == "itself":  # it keeps the right path, and adds its own next token where the draft erred
        assert all(a == SHAPE.depth for a in result.accepted[:-1])
    else:
        assert sum(result.accepted) < len(result.accepted)


@torch.no_grad()
def test_int4_target_with_a_kangaroo_intermediate():
    """An EAGLE-3 head drafts, a Kangaroo adapter on the target's first layers narrows, an int4 target verifies."""
    float_model, _, _, _ = trained_case("kangaroo")
    _, eagle_spec, eagle_cfg, eagle_draft = trained_case("eagle3")
    _, kangaroo_spec, kangaroo_cfg, adapter = trained_case("kangaroo")
    model = quantize_decoder(copy.deepcopy(float_model), "int4")
    info = TargetInfo.from_hf_config(model.config, "tiny")
    target = from_hf(model, info)
    engine = SpecEngine(target, eagle_spec.runtime(eagle_draft, eagle_cfg, target), SHAPE, 128,
                        hf_rope_tables(model, 128), intermediate=kangaroo_spec.intermediate(adapter, kangaroo_cfg,
                                                                                            target))
    assert engine.capture == sorted(set(eagle_spec.feature_layers(eagle_cfg, info)) | {adapter.exit_layer})
    result = engine.generate(PROMPT, 24)
    assert result.tokens == hf_greedy(model, PROMPT, 24)
    assert result.tokens == engine.decode_plain(PROMPT, 24).tokens


def test_chains_and_sampling_are_refused():
    model = tiny_hf("llama")
    with pytest.raises(SpecdraftError, match="narrows a tree: drop --chain"):
        _engine(model, OracleDrafter([1, 2, 3], 320), model, TreeShape.chain(3))
    engine = _engine(model, OracleDrafter([1, 2, 3], 320), model)
    with pytest.raises(SpecdraftError, match="decodes greedily; got temperature 0.7"):
        engine.generate([1, 2, 3], 4, temperature=0.7)
