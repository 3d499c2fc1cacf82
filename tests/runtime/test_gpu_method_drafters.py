"""On a GPU: every method's drafter gives the same tokens and acceptance in the CUDA-graphed engine as in the
eager one, and (fp32) the target's greedy output; so does Kangaroo's tree verify from its shallow states."""
import pytest
import torch

from specdraft.methods import METHODS
from specdraft.core.types import DraftContext, TargetInfo
from specdraft.decoding.engine import SpecEngine
from specdraft.decoding.verifier import from_hf, hf_rope_tables
from specdraft.decoding.tree import TreeShape
from specdraft.testing.tiny import tiny_llama_config
from tests.runtime.drafts import CASES
from tests.runtime.test_method_drafters import RUNTIME_METHODS

pytestmark = pytest.mark.gpu


def _engine(method, dtype, shape, use_graphs, **options):
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_llama_config(layers=4)).eval().to("cuda", dtype)
    info = TargetInfo.from_hf_config(model.config, "tiny")
    spec = METHODS[method]
    cfg = spec.config(**CASES[method])
    draft = spec.build(cfg, DraftContext(info, torch.randint(0, 50, (info.vocab_size,)))).eval().to("cuda", dtype)
    target = from_hf(model, info)
    engine = SpecEngine(target, spec.runtime(draft, cfg, target), shape, 512, hf_rope_tables(model, 512), use_graphs,
                        **options)
    return engine


@pytest.mark.parametrize("method", RUNTIME_METHODS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [TreeShape.chain(4), TreeShape(depth=4, topk=4, budget=16)], ids=["chain", "tree"])
@torch.no_grad()
def test_graphed_engine_equals_eager_engine(method, dtype, shape):
    prompt = torch.randint(0, 300, (21,), generator=torch.Generator().manual_seed(0)).tolist()
    eager = _engine(method, dtype, shape, use_graphs=False)
    graphed = _engine(method, dtype, shape, use_graphs=True)
    for _ in range(2):  # the second run replays the captured graphs
        expected, got = eager.generate(prompt, 64), graphed.generate(prompt, 64)
        assert got.tokens == expected.tokens and got.accepted == expected.accepted
    if dtype == torch.float32:
        assert expected.tokens == eager.decode_plain(prompt, 64).tokens


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@torch.no_grad()
def test_graphed_kangaroo_tree_verify_from_the_shallow_states_equals_eager(dtype):
    prompt = torch.randint(0, 300, (21,), generator=torch.Generator().manual_seed(0)).tolist()
    shape = TreeShape(depth=4, topk=4, budget=16)
    eager = _engine("kangaroo", dtype, shape, use_graphs=False, reuse_shallow_tree=True)
    graphed = _engine("kangaroo", dtype, shape, use_graphs=True, reuse_shallow_tree=True)
    assert graphed.tree_start_layer == graphed.drafter.exit_layer
    for _ in range(2):  # the second run replays the captured graph
        expected, got = eager.generate(prompt, 64), graphed.generate(prompt, 64)
        assert got.tokens == expected.tokens and got.accepted == expected.accepted
    if dtype == torch.float32:
        assert expected.tokens == eager.decode_plain(prompt, 64).tokens
