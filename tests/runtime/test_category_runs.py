"""The drafting-policy suite's run (`specdraft.runtime.categories`, tools/bench/policies.py) with every variant
built over one tiny target, CPU: the tensors each captured graph reads outlive it (CaptureOnCpu: CUDA graphs keep
addresses, not references), over more prompt lengths than any bounded cache of constants would keep; a variant
that fails is recorded and the others go on, the report written as each category ends; a prompt too long for
any variant's cache is skipped and counted."""
import json
import weakref
from pathlib import Path

import pytest
import torch

from specdraft.config import RuntimeConfig, TargetConfig
from specdraft.core.types import DraftContext, TargetInfo
from specdraft.decoding import graphs
from specdraft.drafts import LoadedDraft
from specdraft.methods import METHODS
from specdraft.runtime.categories import (CategorySettings, categories_table, category_prompts, run_categories,
                                          variant_configs)
from specdraft.runtime.load import build_runtime
from specdraft.targets.load import LoadedTarget
from specdraft.testing.tiny import byte_tokenizer, tiny_llama_config
from tests.runtime.replay import CaptureOnCpu

VARIANTS = ["fixed", "sam,sam_min_match=2", "sam,sam_min_match=2,sam_merge=true", "svip", "ddd", "ddd,depth=5",
            "adaptive,depth=4"]
"""The suite's CATEGORY_VARIANTS on a tiny tree (the shape below), in its order."""
CATEGORIES = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")


def _parts():
    """A tiny random target (a repetitive one: retrieval drafts land) with a byte tokenizer and a random EAGLE-3
    draft, as load_parts gives them."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    tokenizer = byte_tokenizer()
    config = tiny_llama_config(layers=4)
    config.eos_token_id, config.pad_token_id = tokenizer.eos_token_id, tokenizer.pad_token_id
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)
    info, spec = TargetInfo.from_hf_config(model.config, "tiny"), METHODS["eagle3"]
    cfg = spec.config(draft_vocab_size=200, init_std=0.3)
    draft = spec.build(cfg, DraftContext(info, torch.randint(0, 50, (info.vocab_size,)))).eval()
    loaded = LoadedDraft(spec=spec, method_cfg=cfg, draft=draft, target=info, target_config=TargetConfig(path="tiny"),
                         runtime=RuntimeConfig(), source=Path("tiny"))
    return loaded, LoadedTarget(model=model, tokenizer=tokenizer, info=info)


def _runtimes(variants, max_len=256, graphs=False):
    """{variant: Runtime} over one target, the suite's way; `graphs`: the engines run their graphed paths (with
    CaptureOnCpu patched in) each prompt length its own prefill graphs."""
    loaded, target = _parts()
    base = RuntimeConfig(device="cpu", max_len=max_len, depth=3, topk=3, budget=8, sam_draft=6)
    runtimes = {name: build_runtime(loaded, target, cfg) for name, cfg in variant_configs(base, variants).items()}
    for runtime in runtimes.values():
        runtime.engine.use_graphs = graphs
        runtime.engine.prefill_rows = 1
    return runtimes


def _questions(path, per_category, lengths):
    """A Spec-Bench-shaped file: per category, prompts of the given lengths (in characters: bytes, so tokens),
    each repeating its words (retrieval finds them)."""
    lines, lengths = [], iter(lengths)
    for category in CATEGORIES:
        for _ in range(per_category):
            text = ("say the cat sat on the mat again " * 40)[:next(lengths)]
            lines.append(json.dumps({"category": category, "turns": [text]}))
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Small CPU ops on one thread (conftest's one_thread: on a busy machine, 2-4x faster)."""


@torch.no_grad()
def test_what_each_captured_graph_reads_outlives_it(monkeypatch, tmp_path):
    """Seven variants over one target meet 18 prompt lengths and their cycle sizes: a bounded cache of the ingest's
    constants (16 sizes) freed some that earlier prefill graphs read, and on a GPU those graphs' ingests wrote the
    drafter's keys at the slots the reused memory then held (issue 32's illegal memory access)."""
    monkeypatch.setattr(graphs, "CallGraph", CaptureOnCpu)
    monkeypatch.setattr(CaptureOnCpu, "graphs", [])
    monkeypatch.setattr(CaptureOnCpu, "owned", weakref.WeakValueDictionary())
    runtimes = _runtimes(VARIANTS, graphs=True)
    prompts = _questions(tmp_path / "question.jsonl", 3, range(4, 22))
    settings = CategorySettings(prompts=prompts, variants=VARIANTS, max_new_tokens=4, lossless_prompts=0)
    report = run_categories(runtimes, settings, tmp_path)
    assert not report["errors"] and len(report["rows"]) == 6 * len(VARIANTS)
    assert all(row["same_as_plain"] == 3 for row in report["rows"])
    assert len(CaptureOnCpu.graphs) > 6 * 18 and CaptureOnCpu.freed_reads() == []


def _failing(runtime, when):
    """The runtime's engine.generate raising where `when(prompt)` says so."""
    generate = runtime.engine.generate

    def maybe_failing(prompt, *args, **kwargs):
        if when(prompt):
            raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore lines")
        return generate(prompt, *args, **kwargs)

    runtime.engine.generate = maybe_failing


@torch.no_grad()
def test_a_failing_variant_is_recorded_and_the_others_go_on(monkeypatch, tmp_path):
    from specdraft.runtime import categories

    variants = ["fixed", "sam,sam_min_match=2", "ddd"]
    runtimes = _runtimes(variants)
    prompts = _questions(tmp_path / "question.jsonl", 2, range(10, 130, 10))
    second_summary = runtimes["fixed"].encode_chat(category_prompts(prompts, 2)["summarization"][1])
    _failing(runtimes["sam,sam_min_match=2"], lambda prompt: list(prompt) == second_summary)
    _failing(runtimes["ddd"], lambda prompt: True)
    written = []
    monkeypatch.setattr(categories, "write_json", lambda path, report: written.append(len(report["rows"])))
    settings = CategorySettings(prompts=prompts, variants=variants, max_new_tokens=6, lossless_prompts=1)
    report = run_categories(runtimes, settings, tmp_path)
    assert [(e["variant"], e["category"], e["stage"]) for e in report["errors"]] == [
        ("ddd", None, "warm"), ("sam,sam_min_match=2", "summarization", "timed")]
    assert report["errors"][1]["error"] == "RuntimeError: CUDA error: an illegal memory access was encountered"
    rows = {(row["category"], row["variant"]) for row in report["rows"]}
    assert rows == {(c, v) for c in CATEGORIES for v in variants[:2]} - {("summarization", variants[1])}
    assert all(row["same_as_plain"] == 2 and row["float32_identical"] == 1 for row in report["rows"])
    assert report["complete"] and written == [2, 4, 5, 7, 9, 11, 11]  # after each category, then at the end
    assert "| 0 | ddd | every | warm | RuntimeError: CUDA error" in categories_table(report)


@torch.no_grad()
def test_a_prompt_at_the_largest_variants_limit_decodes_and_a_longer_one_is_skipped(tmp_path):
    """Every variant over one target with a prompt that fills the cache of the one needing most room (prompt, the
    answer, a merged tree and retrieval draft, a cycle in flight): each decodes it as plain decoding does (the
    references raise on a write past the cache); one token longer, the prompt is skipped and counted."""
    max_len, new = 160, 8
    runtimes = _runtimes(VARIANTS, max_len=max_len)
    template = len(runtimes["fixed"].encode_chat(""))
    room = max(runtime.engine.room_needed(0, new) for runtime in runtimes.values())
    fits = max_len - room - template
    prompts = _questions(tmp_path / "question.jsonl", 2, [fits, fits + 1] * len(CATEGORIES))
    settings = CategorySettings(prompts=prompts, variants=VARIANTS, max_new_tokens=new, lossless_prompts=1,
                                categories=("rag",))
    report = run_categories(runtimes, settings, tmp_path)
    assert report["skipped_prompts"] == {"rag": 1} and not report["errors"]
    assert [row["variant"] for row in report["rows"]] == VARIANTS
    assert all(row["prompts"] == 1 and row["same_as_plain"] == 1 for row in report["rows"])
    assert runtimes["sam,sam_min_match=2"].engine.policy_stats()["retrieval_cycles"] > 0
