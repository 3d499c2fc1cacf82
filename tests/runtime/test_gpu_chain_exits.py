"""On a GPU: chain cycles with the confidence exit η, the dynamic draft length (and exit layer) and the
shallow-state verify give the same tokens, acceptance and drafted lengths in the CUDA-graphed engine (a graph
per draft depth and per verify length) as in the eager one, fp32, and the target's greedy output."""
import pytest
import torch

from specdraft.methods import METHODS
from specdraft.core.types import DraftContext, TargetInfo
from specdraft.decoding.policies.dynamic_exit import ExitChoice
from specdraft.decoding.engine import SpecEngine
from specdraft.decoding.verifier import from_hf, hf_rope_tables
from specdraft.decoding.tree import TreeShape
from specdraft.testing.tiny import tiny_llama_config
from tests.runtime.drafts import CASES

pytestmark = pytest.mark.gpu


def _engine(method, use_graphs, exit_layers=(), **options):
    """A tiny fp32 target and a random draft of `method`; with exit_layers, Kangaroo drafts at each, one chosen
    per cycle (dynamic_exit.ExitChoice)."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_llama_config(layers=4)).eval().to("cuda", torch.float32)
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)  # a peaked, repetitive target: drafts get accepted, confidences vary
    info = TargetInfo.from_hf_config(model.config, "tiny")
    spec, target = METHODS[method], from_hf(model, info)
    drafters = []
    for overrides in [{"exit_layer": layer} for layer in exit_layers] or [{}]:
        cfg = spec.config(**{**CASES[method], **overrides})
        draft = spec.build(cfg, DraftContext(info, torch.randint(0, 50, (info.vocab_size,)))).eval().to("cuda")
        drafters.append(spec.runtime(draft, cfg, target))
    drafter = ExitChoice(drafters) if exit_layers else drafters[0]
    return SpecEngine(target, drafter, TreeShape.chain(5), 512, hf_rope_tables(model, 512), use_graphs, **options)


@pytest.mark.parametrize("method", ["kangaroo", "eagle3"])
@pytest.mark.parametrize("options", [{"exit_threshold": 0.0}, {"exit_threshold": 0.2}, {"exit_threshold": 0.6},
                                     {"exit_threshold": 0.2, "dynamic_exit": True},
                                     {"exit_threshold": 0.2, "reuse_shallow": False}],
                         ids=["no_exit", "eta_0.2", "eta_0.6", "eta_del", "eta_full_verify"])
@torch.no_grad()
def test_graphed_chain_cycles_equal_eager_ones(method, options):
    prompt = torch.randint(0, 300, (21,), generator=torch.Generator().manual_seed(0)).tolist()
    eager, graphed = _engine(method, False, **options), _engine(method, True, **options)
    for _ in range(2):  # the second run replays the captured graphs
        expected, got = eager.generate(prompt, 64), graphed.generate(prompt, 64)
        assert got.tokens == expected.tokens
        assert got.accepted == expected.accepted and got.drafted == expected.drafted
    assert expected.tokens == eager.decode_plain(prompt, 64).tokens
    if options["exit_threshold"] > 0:
        chain_keys = [key for key in graphed.graphs.keys() if isinstance(key, tuple) and key[0] == "chain"]
        assert chain_keys and all(key[1] != "whole" for key in chain_keys)


@torch.no_grad()
def test_graphed_exit_layer_choice_equals_eager():
    prompt = torch.randint(0, 300, (21,), generator=torch.Generator().manual_seed(0)).tolist()
    options = {"exit_layers": (1, 2), "exit_threshold": 0.2, "dynamic_exit": True}
    eager, graphed = _engine("kangaroo", False, **options), _engine("kangaroo", True, **options)
    for _ in range(2):
        expected, got = eager.generate(prompt, 64), graphed.generate(prompt, 64)
        assert got.tokens == expected.tokens and got.drafted == expected.drafted and got.exits == expected.exits
    assert expected.tokens == eager.decode_plain(prompt, 64).tokens
