"""On a GPU: the CUDA-graphed engine gives what the eager one gives, token for token and cycle for cycle."""
import pytest
import torch

from specdraft.core.types import DraftContext, TargetInfo
from specdraft.methods.eagle3 import Eagle3Config, Eagle3Draft, Eagle3Drafter
from specdraft.decoding.engine import SpecEngine
from specdraft.decoding.verifier import from_hf, hf_rope_tables
from specdraft.decoding.tree import TreeShape
from specdraft.testing.tiny import tiny_llama_config

pytestmark = pytest.mark.gpu


def _engine(dtype, shape, use_graphs):
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_llama_config(layers=4)).eval().to("cuda", dtype)
    info = TargetInfo.from_hf_config(model.config, "tiny")
    counts = torch.randint(0, 50, (info.vocab_size,))
    draft = Eagle3Draft(Eagle3Config(draft_vocab_size=200, init_std=0.3), DraftContext(info, counts))
    draft = draft.eval().to("cuda", dtype)
    target = from_hf(model, info)
    engine = SpecEngine(target, Eagle3Drafter(draft, target), shape, 512, hf_rope_tables(model, 512), use_graphs)
    return model, engine


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [TreeShape.chain(4), TreeShape(depth=4, topk=4, budget=16)])
@torch.no_grad()
def test_graphed_engine_equals_eager_engine(dtype, shape):
    prompt = torch.randint(0, 300, (21,), generator=torch.Generator().manual_seed(0)).tolist()
    model, eager = _engine(dtype, shape, use_graphs=False)
    _, graphed = _engine(dtype, shape, use_graphs=True)
    eager.overlap = False  # each step read before the next; the graphed engine keeps one in flight
    eager.prefill_rows = graphed.prefill_rows  # the prompt padded as the graphs pad it: the same matmul shapes
    for _ in range(2):  # the second run replays the captured graphs
        expected, got = eager.generate(prompt, 64), graphed.generate(prompt, 64)
        assert got.tokens == expected.tokens and got.accepted == expected.accepted
        assert graphed.decode_plain(prompt, 64).tokens == eager.decode_plain(prompt, 64).tokens
    if dtype == torch.float32:
        assert expected.tokens == eager.decode_plain(prompt, 64).tokens


@pytest.mark.parametrize("shape", [TreeShape.chain(4), TreeShape(depth=4, topk=4, budget=16)])
@torch.no_grad()
def test_graphed_sampling_equals_eager_sampling(shape):
    """T > 0: the captured cycle (sampling walk on the device) draws what the eager one draws, seed for seed."""
    prompt = torch.randint(0, 300, (21,), generator=torch.Generator().manual_seed(1)).tolist()
    _, eager = _engine(torch.float32, shape, use_graphs=False)
    _, graphed = _engine(torch.float32, shape, use_graphs=True)
    for seed in range(2):
        runs = [engine.generate(prompt, 64, temperature=1.0, generator=torch.Generator(device="cuda").manual_seed(seed))
                for engine in (eager, graphed)]
        assert runs[1].tokens == runs[0].tokens and runs[1].accepted == runs[0].accepted


@pytest.mark.parametrize("shape", [TreeShape.chain(4), TreeShape(depth=4, topk=4, budget=16)])
@torch.no_grad()
def test_graphed_prefill_of_padded_lengths_equals_the_eager_prefill(shape):
    """float32: the prefill's graphs (one per length rounded up to PREFILL_ROWS) give the eager, unpadded
    prefill's answers, for prompts below, at and past a multiple, each length met twice (the second replays)."""
    _, eager = _engine(torch.float32, shape, use_graphs=False)
    _, graphed = _engine(torch.float32, shape, use_graphs=True)
    assert eager.prefill_rows == 1 and graphed.prefill_rows > 1
    for length in (21, 64, 65, 130, 21):
        prompt = torch.randint(0, 300, (length,), generator=torch.Generator().manual_seed(length)).tolist()
        expected = eager.generate(prompt, 32)
        got = graphed.generate(prompt, 32)
        assert got.tokens == expected.tokens and got.accepted == expected.accepted
        assert graphed.decode_plain(prompt, 32).tokens == expected.tokens
    prefills = {key for key in graphed.graphs.keys() if isinstance(key, str) and key.startswith("prefill@")}
    assert prefills == {"prefill@64", "prefill@128", "prefill@192"}


@pytest.mark.parametrize("shape", [TreeShape.chain(4), TreeShape(depth=4, topk=4, budget=16)])
@torch.no_grad()
def test_the_cycle_split_by_phase_graphs(shape):
    """profile_cycles' split: each phase in its own graph, the three near one graphed cycle; decoding after it
    still gives the eager engine's tokens."""
    from types import SimpleNamespace

    from specdraft.runtime.profile import profile_cycles

    prompt = torch.randint(0, 300, (21,), generator=torch.Generator().manual_seed(2)).tolist()
    _, eager = _engine(torch.float32, shape, use_graphs=False)
    _, graphed = _engine(torch.float32, shape, use_graphs=True)
    profile = profile_cycles(SimpleNamespace(engine=graphed), prompt, cycles=8)
    split = profile["graph_split_ms"]
    assert set(split) == {"draft", "verify", "bookkeeping"} and all(ms > 0 for ms in split.values())
    assert 0.5 * profile["cycle_ms"] < sum(split.values()) < 3 * profile["cycle_ms"], (split, profile["cycle_ms"])
    assert graphed.generate(prompt, 48).tokens == eager.generate(prompt, 48).tokens
