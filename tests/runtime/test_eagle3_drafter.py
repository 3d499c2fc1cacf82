"""The runtime's EAGLE-3 drafter drafts exactly what the training-side chain drafter (`eagle3_propose`, the
TTT layout) drafts, cycle after cycle, with its own KV cache."""
import torch

from specdraft.methods.base import ChainState, DraftContext, TargetFeatures, TargetInfo
from specdraft.methods.eagle3 import Eagle3Config, Eagle3Draft, Eagle3Drafter, eagle3_propose
from specdraft.runtime.engine import SpecEngine
from specdraft.runtime.target import from_hf, hf_rope_tables
from specdraft.runtime.tree import TreeShape, build_tree
from tests.tiny import tiny_llama_config


def _setup(num_draft=3):
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_llama_config(layers=4)).eval()
    info = TargetInfo.from_hf_config(model.config, "tiny")
    counts = torch.randint(0, 50, (info.vocab_size,))
    draft = Eagle3Draft(Eagle3Config(draft_vocab_size=200, init_std=0.3), DraftContext(info, counts)).eval()
    target = from_hf(model, info)
    engine = SpecEngine(target, Eagle3Drafter(draft, target), TreeShape.chain(num_draft), 256,
                        hf_rope_tables(model, 256))
    return model, draft, engine


def _propose(model, draft, confirmed, k):
    tokens = torch.tensor([confirmed])
    out = model(tokens[:, :-1], output_hidden_states=True)
    features = TargetFeatures(hidden_states={i: h for i, h in enumerate(out.hidden_states)})
    state = ChainState(tokens=tokens, features=features, embed=model.get_input_embeddings())
    return eagle3_propose(draft, state, k).tolist()


@torch.no_grad()
def test_chain_drafts_equal_the_training_side_drafter():
    model, draft, engine = _setup()
    prompt = torch.randint(0, 300, (13,)).tolist()
    result = engine.generate(prompt, 24, trace=True)
    generated, emitted = result.tokens, 1
    for cycle, row in enumerate(result.trace):
        confirmed = prompt + generated[:emitted]
        assert row["tokens"][0] == confirmed[-1]
        assert row["tokens"][1:] == _propose(model, draft, confirmed, 3), f"cycle {cycle}"
        emitted += result.accepted[cycle] + 1


@torch.no_grad()
def test_ingesting_in_pieces_equals_ingesting_at_once():
    model, draft, engine = _setup()
    prompt = torch.tensor(torch.randint(0, 300, (12,)).tolist())
    engine.prefill(prompt, 0.0)
    drafter = engine.drafter
    whole = build_tree(drafter, engine.shape, engine.root, engine.prefix_len).tokens.clone()
    hidden, captured = engine.target.run_layers(engine.target.embed(prompt), torch.arange(12),
                                                torch.zeros(1, dtype=torch.long), None, capture=drafter.feature_layers)
    next_tokens = torch.cat([prompt[1:], engine.root])
    for start, stop in ((0, 5), (5, 6), (6, 12)):  # padded to 8 rows, as the engine pads
        rows = torch.arange(start, start + 8).clamp(max=11)
        drafter.ingest({i: h[rows] for i, h in captured.items()}, next_tokens[rows], torch.tensor([start]),
                       torch.tensor([stop - start]))
    assert torch.equal(build_tree(drafter, engine.shape, engine.root, engine.prefix_len).tokens, whole)
