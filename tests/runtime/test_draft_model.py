"""The draft-model baseline (specdraft/decoding/draft_model.py) on tiny random models of one tokenizer, CPU, fp32:
chains and trees decode the target's greedy output exactly, whatever the small model (the target itself, whose
drafts are all accepted: its cache follows the confirmed tokens; an unrelated one; one whose logits break at random
rows or whose weights are NaN), eager and through graph-style static buffers; at T=1 the first token of a cycle
follows the target's distribution; a model of another tokenizer is refused in one line; and `specdraft bench` runs
a target alone with a draft model (no export)."""
from __future__ import annotations

import json

import pytest
import torch

from specdraft import cli
from specdraft.core.types import TargetInfo
from specdraft.decoding import graphs
from specdraft.decoding.draft_model import DraftModelDrafter, cost_in_target_layers
from specdraft.decoding.engine import SpecEngine
from specdraft.decoding.shapes import TreeShape
from specdraft.decoding.verifier import from_hf, hf_rope_tables
from specdraft.runtime.draft_model import tokenizer_mismatch
from specdraft.testing.tiny import byte_tokenizer, save_tiny_target, tiny_llama_config
from tests.runtime.peaked_target import greedy_tokens
from tests.runtime.replay import ReplayOnCpu
from tests.runtime.sampled_cycles import first_tokens_from_prefix
from tests.runtime.sampled_cycles import CRITICAL, chi_square_top
from tests.runtime.hostile_logits import break_rows

pytestmark = pytest.mark.usefixtures("one_thread")  # small ops: two threads of a busy host ran them 10x slower

CHAIN, TREE = TreeShape.chain(4), TreeShape(depth=4, topk=3, budget=10)
SHAPES = {"chain": CHAIN, "tree": TREE}
PROMPT = torch.randint(0, 300, (13,), generator=torch.Generator().manual_seed(3)).tolist()
MAX_LEN = 256


def _model(seed: int, layers: int = 2, hidden: int = 64):
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_llama_config(layers=layers, hidden=hidden)).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)  # peaked and repetitive, as real text
    return model


TARGET = _model(0)
UNRELATED = _model(1, layers=3, hidden=32)


class BrokenDraftModel(DraftModelDrafter):
    """The small model's logits broken at about half of the rows (NaN rows, NaN entries, +inf, all -inf, 1e30)."""

    def __init__(self, *args, seed: int = 0):
        super().__init__(*args)
        self.generator = torch.Generator().manual_seed(seed)

    def _logits(self, hidden):
        return break_rows(super()._logits(hidden), self.generator)


def _drafter(small, kind=DraftModelDrafter):
    info = TargetInfo.from_hf_config(small.config, "small")
    model = from_hf(small, info)
    return kind(model, hf_rope_tables(small, MAX_LEN), TARGET.config.vocab_size, 1.0)


def _engine(small, shape, use_graphs=False, kind=DraftModelDrafter):
    info = TargetInfo.from_hf_config(TARGET.config, "tiny")
    return SpecEngine(from_hf(TARGET, info), _drafter(small, kind), shape, MAX_LEN, hf_rope_tables(TARGET, MAX_LEN),
                      use_graphs)


@pytest.mark.parametrize("name", sorted(SHAPES))
@torch.no_grad()
def test_the_target_as_its_own_draft_model_has_every_draft_accepted(name):
    """Its drafts are the target's greedy tokens only if its cache holds every confirmed token at its slot: a chain's
    every draft is accepted, a tree's accepted path ends where the tree does (no child of its last node holds the
    target's next token)."""
    engine = _engine(TARGET, SHAPES[name])
    result = engine.generate(PROMPT, 30, trace=True)
    assert result.tokens == greedy_tokens(TARGET, PROMPT, 30)
    if name == "chain":
        assert all(a == CHAIN.depth for a in result.accepted[:-1])  # the last cycle may stop at the 30th token
        return
    emitted = 1  # the prefill's token
    for accepted, row in zip(result.accepted[:-1], result.trace):
        emitted += accepted
        last, bonus = row["accepted_nodes"][-1], result.tokens[emitted]
        assert not any(parent == last and token == bonus for parent, token in zip(row["parents"], row["tokens"]))
        emitted += 1
    assert max(result.accepted) == TREE.depth


@pytest.mark.parametrize("name", sorted(SHAPES))
@pytest.mark.parametrize("small", ["unrelated", "broken", "nan_weights"])
@torch.no_grad()
def test_any_draft_model_decodes_the_targets_greedy_output(name, small):
    model, kind = (UNRELATED, DraftModelDrafter) if small != "broken" else (TARGET, BrokenDraftModel)
    if small == "nan_weights":
        model = _model(1, layers=3, hidden=32)
        model.model.layers[1].mlp.down_proj.weight.data[:, :4] = float("nan")
    engine = _engine(model, SHAPES[name], kind=kind)
    for prompt in (PROMPT, PROMPT[5:]):
        result = engine.generate(prompt, 32)
        assert result.tokens == greedy_tokens(TARGET, prompt, 32)
        assert result.tokens == engine.decode_plain(prompt, 32).tokens
        assert all(0 <= a <= d for a, d in zip(result.accepted, result.drafted))
    if small == "nan_weights":
        assert sum(result.accepted) == 0  # NaN logits draft nothing the target takes


@torch.no_grad()
def test_a_cycle_drafted_without_the_model_still_catches_its_cache_up():
    """Retrieval cycles (the sam policy) draft from the text alone; the model's own chains after them are still all
    accepted when the target is its own draft model: each ingest ran the confirmed tokens into its cache."""
    from specdraft.decoding.policies.sam import SamPolicy
    from specdraft.decoding.policies.suffix_automaton import Retrieval

    info = TargetInfo.from_hf_config(TARGET.config, "tiny")
    engine = SpecEngine(from_hf(TARGET, info), _drafter(TARGET), CHAIN, MAX_LEN, hf_rope_tables(TARGET, MAX_LEN),
                        policy=SamPolicy(Retrieval(6, 2)))
    prompt = PROMPT + greedy_tokens(TARGET, PROMPT, 24)  # the answer repeats what the prompt holds: retrieval matches
    result = engine.generate(prompt, 40)
    assert result.tokens == greedy_tokens(TARGET, prompt, 40)
    stats = engine.policy_stats()
    assert stats["retrieval_cycles"] > 0 and stats["model_cycles"] > 1
    model_cycles = [a for a, d in zip(result.accepted[:-1], result.drafted) if d == CHAIN.depth]
    assert len(model_cycles) > 1 and all(a == CHAIN.depth for a in model_cycles)


@pytest.mark.parametrize("name", sorted(SHAPES))
@torch.no_grad()
def test_static_buffer_replays_give_the_eager_tokens(monkeypatch, name):
    """Every call runs as a CUDA graph replays it (inputs copied into static tensors, outputs written into the
    first call's): the prefill padded to 64 rows, the ingest of a static count, the steps."""
    monkeypatch.setattr(graphs, "CallGraph", ReplayOnCpu)
    eager, replayed = _engine(UNRELATED, SHAPES[name]), _engine(UNRELATED, SHAPES[name], use_graphs=True)
    for prompt in (PROMPT, PROMPT[4:]):
        expected, got = eager.generate(prompt, 24), replayed.generate(prompt, 24)
        assert got.tokens == expected.tokens == greedy_tokens(TARGET, prompt, 24)
        assert got.accepted == expected.accepted
    assert any(str(key).startswith("ingest@") for key in replayed.graphs.keys())


@pytest.mark.parametrize("name", sorted(SHAPES))
@pytest.mark.parametrize("small", ["itself", "broken"])
@torch.no_grad()
def test_sampled_cycles_keep_the_targets_distribution(name, small):
    engine = _engine(TARGET, SHAPES[name], kind=DraftModelDrafter if small == "itself" else BrokenDraftModel)
    root, firsts = first_tokens_from_prefix(engine, PROMPT, 400)
    assert ((firsts >= 0) & (firsts < TARGET.config.vocab_size)).all()
    probs = torch.softmax(TARGET(torch.tensor([PROMPT + [root]])).logits[0, -1], -1)  # [V]
    assert chi_square_top(firsts, probs) < CRITICAL


def test_a_draft_pass_costs_its_weights_in_target_layers():
    target = from_hf(TARGET, TargetInfo.from_hf_config(TARGET.config, "tiny"))
    cost = cost_in_target_layers(target, target)  # the target itself: its layers plus its LM head
    layer = sum(p.numel() for p in target.layers[0].parameters())
    assert cost == pytest.approx(TARGET.config.num_hidden_layers + target.lm_head_weight.numel() / layer)
    assert _drafter(UNRELATED).caps.draft_cost_layers == 1.0


def test_another_tokenizer_is_named_in_one_line():
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    same = byte_tokenizer()
    assert tokenizer_mismatch(byte_tokenizer(), same) is None
    larger = byte_tokenizer()
    larger.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>", "<|tool|>"]})
    assert tokenizer_mismatch(larger, same) == f"its tokenizer holds {len(same) + 1} tokens, the target's {len(same)}"
    layout = json.loads(byte_tokenizer().backend_tokenizer.to_str())  # as many tokens, two bytes' ids exchanged
    ids = layout["model"]["vocab"]
    ids["d"], ids["e"] = ids["e"], ids["d"]
    swapped = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(layout)))
    swapped.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"], "pad_token": "<pad>",
                                "eos_token": "<|im_end|>"})
    assert len(swapped) == len(same)
    assert tokenizer_mismatch(swapped, same) == ("it encodes 'def fibonacci(n):\\n    re'... as [68, 67, 69, 220] "
                                                 "from token 0, the target as [67, 68, 69, 220]")


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    """A tiny target, a smaller model of its tokenizer, and one of another tokenizer (HF directories)."""
    root = tmp_path_factory.mktemp("draft_model")
    target = save_tiny_target(root / "target", seed=0, layers=2)
    small = save_tiny_target(root / "small", seed=5, layers=1)
    other = save_tiny_target(root / "other", seed=6, layers=1)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(other)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>", "<|tool|>"]})
    tokenizer.save_pretrained(other)
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"turns": [f"question {i}?"]}) + "\n" for i in range(2)))
    return target, small, other, prompts


BENCH = ["--device", "cpu", "--dtype", "float32", "--max-len", "256", "--temperature", "0", "--max-prompts", "2",
         "--max-new-tokens", "8", "--no-hf", "--lossless-prompts", "2", "--profile-cycles", "0"]


@pytest.mark.parametrize("shape", [["--chain", "--depth", "3"], ["--depth", "3", "--topk", "2", "--budget", "6"]],
                         ids=["chain", "tree"])
def test_bench_runs_a_target_alone_with_a_draft_model(tiny_pair, tmp_path, capsys, shape):
    target, small, _, prompts = tiny_pair
    assert cli.main(["bench", "--target", str(target), "--draft-model", str(small), "--prompts", str(prompts),
                     "--out", str(tmp_path), *BENCH, *shape]) == 0
    report = json.loads((tmp_path / "bench.json").read_text())
    assert report["lossless_float32"] is True and report["float32_matches_plain"] == "2/2"
    assert report["settings"]["method"] == "draft_model" and report["settings"]["draft"] == str(small)
    assert report["settings"]["target"] == str(target) and report["tau"] >= 1.0
    capsys.readouterr()


def test_the_draft_models_errors_are_one_line(tiny_pair, tmp_path, capsys):
    target, small, other, prompts = tiny_pair
    cases = {  # arguments: what the one line says
        ("--target", str(target), "--draft-model", str(other), "--out", str(tmp_path)):
            f"runtime.draft_model={other} does not share the target's tokenizer (vocabulary 320, the target's 320): "
            f"its tokenizer holds",
        ("--target", str(target), "--out", str(tmp_path)): "give DRAFT_DIR (an export or a training run directory), "
                                                             "or --target TARGET and --draft-model SMALL",
        ("--draft-model", str(small), "--out", str(tmp_path)): "or --target TARGET and --draft-model SMALL",
        ("--target", str(target), "--draft-model", str(small)): "bench without a draft directory needs --out DIR",
    }
    for arguments, message in cases.items():
        assert cli.main(["bench", *arguments, "--prompts", str(prompts), *BENCH]) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert message in err, err
