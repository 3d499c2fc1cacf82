"""The hooks an add-on method plugs into (CPU, tiny target): a method that extends a trained draft
(MethodSpec.base_draft) and trains on records of its own (MethodSpec.records) goes through distill-data (counted,
resumable), train, export (the base draft copied inside) and the runtime (an ExtendedDrafter with its tree
scorer), with no stage knowing its name. The method here is a test double: C2T and Judge plug in the same way."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import pytest
import torch
from torch import nn

from specdraft import cli
from specdraft.config import RuntimeConfig
from specdraft.core.drafting import ExtendedDrafter
from specdraft.core.types import DraftContext, LossOutput
from specdraft.methods import METHODS
from specdraft.methods.base import ExportFormat, MethodSpec, RecordStage
from specdraft.runtime.load import load_runtime
from tests.addons import train_base_export


@dataclass
class ProbeConfig:
    draft: str = ""
    """The draft this add-on extends."""
    threshold: float = 0.0


class ProbeHead(nn.Module):
    def __init__(self, cfg: ProbeConfig, ctx: DraftContext):
        super().__init__()
        assert ctx.base is not None and ctx.base.method == "eagle3"
        self.scale = nn.Parameter(torch.zeros(1))
        object.__setattr__(self, "base", ctx.base)  # not a submodule: the base is saved apart


class KeepAll:
    threshold = 0.0

    def prune(self, child_logprobs, parent_scores, parent_logits, depth):
        return child_logprobs


class ProbeMaker:
    def __init__(self, cfg, ctx):
        self.ctx = ctx

    def records(self, conversations):
        rows, problems = [], []
        for conversation in conversations.values():
            text = conversation.messages[0]["content"]
            if "broken" in text:
                problems.append({"source": conversation.source, "index": conversation.index, "status": "error",
                                 "reason": "a broken prompt"})
            else:
                ids = self.ctx.target.tokenizer(text)["input_ids"]
                rows.append({"source": conversation.source, "index": conversation.index, "lengths": [len(ids)],
                             "base": self.ctx.base.method})
            self.ctx.progress(1)
        return rows, problems


def _features():
    from datasets import Features, Sequence, Value

    return Features({"source": Value("string"), "index": Value("int64"), "lengths": Sequence(Value("float32")),
                     "base": Value("string")})


def _loss(draft, batch, cfg):
    loss = ((draft.scale * batch["lengths"] - 1.0) ** 2).mean()
    return LossOutput(loss=loss, metrics={"tau_sim": 1.0 - loss.detach()})


def _to_hf(draft, cfg, target, section):
    return {"specdraft": {"method": "probe", "method_config": asdict(cfg)}}, {"scale": draft.scale.detach()}


def _from_export(config, tensors, ctx):
    cfg = ProbeConfig(**config["specdraft"]["method_config"])
    draft = ProbeHead(cfg, ctx)
    draft.load_state_dict(tensors)
    return cfg, draft


PROBE = MethodSpec(
    name="probe", config=ProbeConfig, build=ProbeHead, loss=_loss, feature_layers=lambda cfg, target: [],
    exports={"hf": ExportFormat(write=_to_hf, required_keys=lambda draft, target: ["scale"])},
    from_export=_from_export,
    runtime=lambda draft, cfg, target_model: ExtendedDrafter(draft.base.runtime(target_model), scorer=KeepAll()),
    base_draft=lambda cfg: cfg.draft,
    records=RecordStage(features=_features, fingerprint=lambda cfg: {"threshold": cfg.threshold},
                        maker=ProbeMaker,
                        collate=lambda rows: {"lengths": torch.tensor([row["lengths"][0] for row in rows])}),
)


@pytest.fixture
def base_export(tmp_path, tiny_target_dir, distilled):
    return train_base_export(tmp_path / "base", tiny_target_dir, distilled)


def test_an_addon_method_runs_every_stage_through_the_hooks(monkeypatch, tmp_path, tiny_target_dir, base_export):
    monkeypatch.setitem(METHODS, "probe", PROBE)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": text}) + "\n"
                               for text in ["one?", "two?", "a broken one", "three?", "four?"]))
    recipe = tmp_path / "probe.yaml"
    recipe.write_text(f"""
target: {{path: {tiny_target_dir}}}
method: {{name: probe, draft: {base_export}}}
data: {{prompts: [{prompts}], val_fraction: 0.25}}
distill: {{output_dir: {tmp_path / 'records'}, shard_size: 2}}
train: {{output_dir: {tmp_path / 'run'}, max_steps: 3, micro_batch_size: 2, val_every_steps: 3, lr: 0.01,
         warmup_steps: 1, log_every_steps: 1}}
""")
    assert cli.main(["distill-data", str(recipe)]) == 0
    counts = json.loads((tmp_path / "records" / "counts.json").read_text())
    assert counts == {"input": 5, "ok": 4, "error": 1, "skipped": 0}
    shards = sorted((tmp_path / "records" / "shards").iterdir())
    written = [shard.stat().st_mtime for shard in shards]
    assert cli.main(["distill-data", str(recipe)]) == 0  # resumed: every shard already there, none rewritten
    assert [shard.stat().st_mtime for shard in shards] == written
    assert cli.main(["train", str(recipe)]) == 0
    assert (tmp_path / "run" / "best" / "draft.safetensors").is_file()
    assert cli.main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "export")]) == 0
    assert (tmp_path / "export" / "draft" / "model.safetensors").is_file()
    runtime = load_runtime(tmp_path / "export", RuntimeConfig(device="cpu", dtype="float32", depth=3, topk=2,
                                                              budget=6, max_len=128))
    engine = runtime.engine
    assert engine.drafter.caps.scores_tree and engine.tree_scorer is not None
    prompt = runtime.encode_chat("one?")
    assert engine.generate(prompt, 12, runtime.eos_ids).tokens == engine.decode_plain(prompt, 12, runtime.eos_ids).tokens
