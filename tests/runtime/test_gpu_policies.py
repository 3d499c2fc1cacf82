"""On a GPU: each drafting policy's CUDA graphs (retrieval cycles, per-depth tree graphs that read the graph before
them, chain stop reads one depth behind) give what the eager engine gives, greedy and sampled, and greedy stays
the target's output in float32."""
import pytest
import torch

from specdraft.core.types import DraftContext, TargetInfo
from specdraft.decoding.engine import SpecEngine
from specdraft.decoding.policies.ddd import ddd_policy
from specdraft.decoding.policies.sam import SamPolicy
from specdraft.decoding.policies.suffix_automaton import Retrieval
from specdraft.decoding.policies.svip import svip_policy
from specdraft.decoding.verifier import from_hf, hf_rope_tables
from specdraft.decoding.tree import TreeShape
from specdraft.methods.eagle3 import Eagle3Config, Eagle3Draft, Eagle3Drafter
from specdraft.testing.tiny import tiny_llama_config

pytestmark = pytest.mark.gpu
TREE, CHAIN = TreeShape(depth=4, topk=4, budget=16), TreeShape.chain(4)
POLICIES = {
    "sam": (TREE, lambda: {"policy": SamPolicy(Retrieval(8, 2))}),
    "sam_merge": (TREE, lambda: {"policy": SamPolicy(Retrieval(8, 2), merge=True)}),
    "ddd_tree": (TREE, lambda: {"policy": ddd_policy(0.05)}),
    "svip_tree": (TREE, lambda: {"policy": svip_policy(0.01)}),
    "ddd_chain": (CHAIN, lambda: {"policy": ddd_policy(0.05)}),
}


def _engine(name, use_graphs, dtype=torch.float32, max_len=512):
    from transformers import LlamaForCausalLM

    shape, options = POLICIES[name]
    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_llama_config(layers=4)).eval().to("cuda", dtype)
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)  # a repetitive target: its text repeats, so retrieval drafts land
    info = TargetInfo.from_hf_config(model.config, "tiny")
    counts = torch.randint(0, 50, (info.vocab_size,))
    draft = Eagle3Draft(Eagle3Config(draft_vocab_size=200, init_std=0.3), DraftContext(info, counts))
    target = from_hf(model, info)
    engine = SpecEngine(target, Eagle3Drafter(draft.eval().to("cuda", dtype), target), shape, max_len,
                        hf_rope_tables(model, max_len), use_graphs, **options())
    return model, engine


@pytest.mark.parametrize("name", sorted(POLICIES))
@torch.no_grad()
def test_graphed_policies_equal_eager_ones(name):
    prompt = torch.randint(0, 300, (21,), generator=torch.Generator().manual_seed(0)).tolist()
    _, eager = _engine(name, use_graphs=False)
    _, graphed = _engine(name, use_graphs=True)
    eager.prefill_rows = graphed.prefill_rows
    for _ in range(2):  # the second run replays the captured graphs
        expected, got = eager.generate(prompt, 64), graphed.generate(prompt, 64)
        assert got.tokens == expected.tokens and got.drafted == expected.drafted
    assert expected.tokens == eager.decode_plain(prompt, 64).tokens
    for seed in range(2):
        runs = [engine.generate(prompt, 48, temperature=1.0, generator=torch.Generator(device="cuda").manual_seed(seed))
                for engine in (eager, graphed)]
        assert runs[1].tokens == runs[0].tokens and runs[1].drafted == runs[0].drafted


@torch.no_grad()
def test_engines_meeting_many_prompt_lengths_decode_as_eager_ones():
    """Three policies' engines in one process meet 15 prefill lengths and their cycle sizes, then all of them again:
    every graphed decoding equals the eager one (the prefill graphs find the constants they captured where they
    were)."""
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 300, (64 * k + 1,), generator=generator).tolist() for k in range(15)]
    for name in ("sam", "ddd_tree", "svip_tree"):
        _, eager = _engine(name, use_graphs=False, max_len=1024)
        _, graphed = _engine(name, use_graphs=True, max_len=1024)
        eager.prefill_rows = graphed.prefill_rows
        for prompt in prompts + prompts:
            assert graphed.generate(prompt, 16).tokens == eager.generate(prompt, 16).tokens
