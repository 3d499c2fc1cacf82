"""specdraft's `speculators` exports (the layout vLLM loads) read by speculators 0.9.0's own model classes
(`SpeculatorModel.from_pretrained`, the tiny target as its verifier): EAGLE-3 with and without EAGLE-3.1's flags
and P-EAGLE. Each loaded speculator's logits on the same inputs equal the specdraft draft's, step by step (EAGLE-3's
training-time test, teacher-forced) or row by row (P-EAGLE's parallel rows, at the positions speculators' own
conditional drop-token sampling drew). CPU, float32; skipped where speculators is not installed
(tests/speculators_pkg.py)."""
import json

import pytest
import torch

from specdraft.config import TargetConfig
from specdraft.core.tensor_files import save_tensors
from specdraft.core.types import DraftContext
from specdraft.methods import get_method
from specdraft.methods.eagle3 import ttt_unroll
from specdraft.methods.peagle import Rollout, rollout_hidden
from specdraft.methods.eagle3 import fused_features
from specdraft.targets import capture_features, load_target
from tests.speculators_pkg import speculators_package  # noqa: F401  (the fixture)


@pytest.fixture(scope="module")
def target(tiny_target_dir):
    return load_target(TargetConfig(path=str(tiny_target_dir)))


def _export(tmp_path, method, settings, target, verifier):
    """A random draft of `method` and its speculators export in tmp_path -> (draft, the export's directory)."""
    torch.manual_seed(0)  # the draft's random weights, the same whatever ran before
    spec = get_method(method)
    cfg = spec.config(**{"feature_layers": [1, 2, 3], **settings})  # distinct layers, as speculators requires
    draft = spec.build(cfg, DraftContext(target.info, torch.arange(target.info.vocab_size))).eval()
    with torch.no_grad():  # norms away from 1, so that a misplaced one shows
        for name, param in draft.named_parameters():
            if name.endswith("norm.weight") or ".fc_norm." in f".{name}":
                param.uniform_(0.5, 1.5)
    config, tensors = spec.exports["speculators"].write(draft, cfg, target.info,
                                                         {"target": str(verifier), "target_hub_id": str(verifier)})
    config["torch_dtype"] = "float32"  # as `specdraft export --dtype float32` writes it
    # speculators' default attention (flex, block masks of 128 rows) does not run these lengths on a CPU: its eager one
    config["transformer_layer_config"]["attn_implementation"] = "eager"
    (tmp_path / "config.json").write_text(json.dumps(config))
    save_tensors({k: v.contiguous() for k, v in tensors.items()}, tmp_path / "model.safetensors",
                 metadata={"format": "pt"})
    return draft, tmp_path


def _load(directory, target):
    """The export in speculators' own class, with the verifier's embedding table set from the target (what
    speculators' load_verifier_weights reads from a hub checkpoint; the tiny target's leaves it at its random
    init here), as vLLM hands the draft its target's embedding."""
    from speculators import SpeculatorModel

    loaded = SpeculatorModel.from_pretrained(str(directory)).eval()
    with torch.no_grad():
        loaded.embed_tokens.weight.copy_(target.model.get_input_embeddings().weight)
    return loaded


def _inputs(target, draft, length=18):
    ids = torch.randint(0, 250, (1, length), generator=torch.Generator().manual_seed(5))
    feats = capture_features(target.model, ids, torch.ones_like(ids), draft.feature_layers)
    aux = torch.cat([feats.hidden_states[i] for i in draft.feature_layers], dim=-1)  # [1, T, 3H]
    return ids, feats, aux


class _Logits:
    """Every output of a module (the speculator's lm_head), in call order."""

    def __init__(self, module):
        self.outputs = []
        self.handle = module.register_forward_hook(lambda _m, _i, out: self.outputs.append(out.detach()))


@pytest.mark.parametrize("flags", [{}, {"fc_norm": True},
                                   {"fc_norm": True, "norm_output": True}],
                         ids=["eagle3", "fc_norm", "eagle3.1"])
@torch.no_grad()
def test_eagle3_export_loads_in_speculators_with_the_same_logits(speculators_package, tmp_path, target,
                                                                  tiny_target_dir, flags):
    from speculators.models.eagle3 import Eagle3DraftModel

    steps = 3
    draft, directory = _export(tmp_path, "eagle3", {"ttt_steps": steps, "draft_vocab_size": 200, **flags}, target,
                               tiny_target_dir)
    loaded = _load(directory, target)
    assert type(loaded) is Eagle3DraftModel and loaded.config.fc_norm == bool(flags.get("fc_norm"))
    assert loaded.config.norm_output == bool(flags.get("norm_output"))
    ids, feats, aux = _inputs(target, draft)
    columns = ids.shape[1] - 1  # speculators' shifted batch: column t holds features g_t and token x_{t+1}
    logits = _Logits(loaded.lm_head)
    loaded(hidden_states=aux[:, :columns], input_ids=ids[:, 1:], document_ids=torch.zeros(1, columns, dtype=torch.long),
           ttt_steps=steps)
    ours = list(ttt_unroll(draft, feats.hidden_states, steps))  # [1, T, Vd] each
    assert len(logits.outputs) == steps
    for step, (theirs, mine) in enumerate(zip(logits.outputs, ours)):
        valid = columns - step  # columns whose teacher-forced tokens lie inside the sequence
        torch.testing.assert_close(theirs[:, :valid], mine[:, :valid], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("flags", [{}, {"fc_norm": True}], ids=["peagle", "fc_norm"])
@torch.no_grad()
def test_peagle_export_loads_in_speculators_with_the_same_logits(speculators_package, tmp_path, target,
                                                                  tiny_target_dir, monkeypatch, flags):
    from speculators.models.peagle import PEagleDraftModel
    from speculators.losses.eager import kl_div_loss
    from speculators.models.peagle import core as peagle_core

    depths = 4
    draft, directory = _export(tmp_path, "peagle", {"num_depths": depths, "draft_vocab_size": 200, **flags},
                               target, tiny_target_dir)
    loaded = _load(directory, target)
    assert type(loaded) is PEagleDraftModel and loaded.config.mask_token_id == draft.mask_token_id
    assert loaded.config.speculators_config.proposal_methods[0].speculative_tokens == depths
    torch.testing.assert_close(loaded.mask_hidden, draft.mask_input.mask_hidden)
    ids, feats, aux = _inputs(target, draft)
    columns = ids.shape[1] - 1
    drawn = []
    sample = peagle_core.generate_cod_sample_indices
    monkeypatch.setattr(peagle_core, "generate_cod_sample_indices",
                        lambda *args, **kwargs: drawn.append(sample(*args, **kwargs)) or drawn[-1])
    logits = _Logits(loaded.lm_head)
    loaded(hidden_states=aux[:, :columns], input_ids=ids[:, 1:], document_ids=torch.zeros(1, columns, dtype=torch.long),
           verifier_last_hidden_states=feats.final_hidden[:, 1:], num_depths=depths,
           loss_config={"kl_div": (kl_div_loss, 1.0)})  # the loss's plain PyTorch version: no Triton on a CPU
    (anchors, groups), = drawn  # [L] each: depth 0 every column, then each depth's sampled columns
    sizes = torch.bincount(groups, minlength=depths).tolist()
    assert sizes[0] == columns and all(size > 0 for size in sizes)  # every depth drew some rows
    rollout = Rollout(anchors=anchors[None], groups=groups[None], sizes=sizes, parents=[])
    fused = fused_features(draft, {i: h[:, :columns] for i, h in feats.hidden_states.items()})
    next_embeds = feats.hidden_states[0][:, 1:]  # column t: the embedding of x_{t+1}
    mask_embed = target.model.get_input_embeddings().weight[draft.mask_token_id]
    hidden = rollout_hidden(draft, rollout, fused, next_embeds, mask_embed, torch.arange(columns)[None], None, "dense")
    torch.testing.assert_close(logits.outputs[0], draft.logits(hidden), rtol=1e-4, atol=1e-4)
