"""MethodSpec's default from_export (methods/base.py `read_export`), which EAGLE-3, PosS, Kangaroo and ViSpec use:
the saved method_config rebuilt and every tensor loaded strictly; an SGLang-style EAGLE-3 checkpoint without one
read from its own keys (vLLM's layer names mapped back, what the head does not hold left out); a method_config that
is not the method's, or none, refused in one line. CPU, a tiny random geometry, no target weights."""
import pytest
import torch

from specdraft.core.errors import SpecdraftError
from specdraft.core.types import DraftContext, TargetInfo
from specdraft.methods import METHODS
from specdraft.methods.base import read_export
from specdraft.testing.tiny import tiny_llama_config

INFO = TargetInfo.from_hf_config(tiny_llama_config(), "tiny")
SETTINGS = {"eagle3": {"draft_vocab_size": 256}, "poss": {"draft_vocab_size": 256},
            "kangaroo": {"draft_vocab_size": 256, "exit_layer": 2}}


def _export(method: str, fmt: str = "hf"):
    """(config.json, tensors, the draft) of a fresh `method` draft in its `fmt` layout."""
    spec = METHODS[method]
    cfg = spec.config(**SETTINGS[method])
    draft = spec.build(cfg, DraftContext(INFO, torch.arange(INFO.vocab_size)))
    config, tensors = spec.exports[fmt].write(draft, cfg, INFO, {"target": "tiny"})
    return config, tensors, draft


def _same_weights(draft, rebuilt):
    assert draft.state_dict().keys() == rebuilt.state_dict().keys()
    assert all(torch.equal(rebuilt.state_dict()[name], value) for name, value in draft.state_dict().items())


@pytest.mark.parametrize("method", ["eagle3", "poss", "kangaroo", "vispec"])
def test_the_four_heads_read_their_exports_by_the_default(method):
    assert METHODS[method].from_export.func is read_export


@pytest.mark.parametrize("method", sorted(SETTINGS))
def test_a_saved_method_config_rebuilds_the_draft(method):
    config, tensors, draft = _export(method)
    cfg, rebuilt = METHODS[method].from_export(config, tensors, DraftContext(INFO))
    assert cfg == METHODS[method].config(**SETTINGS[method])
    _same_weights(draft, rebuilt)


@pytest.mark.parametrize("fmt", ["hf", "speculators"])
def test_an_eagle3_checkpoint_without_a_method_config_is_read_from_its_own_keys(fmt):
    config, tensors, draft = _export("eagle3", fmt)
    del config["specdraft"]
    tensors["embed_tokens.weight"] = torch.zeros(INFO.vocab_size, INFO.hidden_size)  # SGLang's: not the head's
    cfg, rebuilt = METHODS["eagle3"].from_export(config, tensors, DraftContext(INFO))
    assert cfg.draft_vocab_size == 256 and rebuilt.feature_layers == draft.feature_layers
    _same_weights(draft, rebuilt)


def test_a_method_config_that_is_not_the_methods_is_refused():
    config, tensors, _ = _export("eagle3")  # an EAGLE-3 method_config: PosS's defaults would fill the rest
    with pytest.raises(SpecdraftError, match=r"no poss method_config in config.json\['specdraft'\]"):
        METHODS["poss"].from_export(config, tensors, DraftContext(INFO))


@pytest.mark.parametrize("method", ["poss", "kangaroo", "vispec"])
def test_an_export_without_a_method_config_is_refused_by_a_head_no_other_tool_writes(method):
    config = {"specdraft": {"method": method}}
    with pytest.raises(SpecdraftError, match=f"no {method} method_config"):
        METHODS[method].from_export(config, {}, DraftContext(INFO))


def test_a_tensor_the_draft_does_not_hold_is_refused():
    config, tensors, _ = _export("kangaroo")
    tensors["extra.weight"] = torch.zeros(1)
    with pytest.raises(RuntimeError, match="extra.weight"):
        METHODS["kangaroo"].from_export(config, tensors, DraftContext(INFO))
