"""Kernel launches of one plain decoding step and of one speculative cycle by phase (draft, verify, bookkeeping),
counted on the CPU (`specdraft.decoding.launches`) for an EAGLE-3 head over a random target of a real geometry.

A small target decodes bound by its launches: on an H100 a graphed SmolLM2 cycle takes about 2-3 µs a launch
(docs/benchmarks.md, runtime suite). So cycle launches over plain-step launches is the cycle's cost in plain steps,
and a shape reaches a speedup S over plain decoding only at τ ≥ S × that ratio (before any host work). The
counts do not depend on the weights, so random ones serve; they do depend on the shape, the layer count and the
fused kernels (run with TRITON_INTERPRET=1 to count the Triton kernels as the GPU runs them).

    TRITON_INTERPRET=1 python -m tools.count_cycle_launches --config smollm2 --shapes 6 6,8,48 5,8,32 \\
        --out runs/cycle_launches

Prints a table and writes OUT/cycle_launches.json; each row counts the cycle's host syncs too (reads of values and
ops of data-dependent shapes, `LaunchCounter.syncs`: a graphed cycle holds none). With --temperatures 0 1 each
shape's cycle is also counted at T = 1 (recursive rejection sampling, drafts sampled from the draft as the runtime
does by default; with --point-mass, with point-mass drafts too): its column `draws` counts what the host launches
outside the cycle's one graph every cycle (the uniforms and the drafts' Exp(1) noise, and their copies into the graph's
inputs); draft, verify and bookkeeping run inside it as at T = 0. With --prune BETA, each tree shape also drafted
with a C2T tree scorer at β (`specdraft.methods.c2t`), pruning from the selection and during the expansion
(runtime.prune_at): the scorer's launches a cycle against the unpruned tree's (the phases of the budget's verify:
a sized verify's drafting adds `tree.kept_first`). With --depth-stops, each tree shape's cycle also as a policy
that stops growing the tree (runtime.policy ddd or svip, `specdraft.decoding.cycles.depth_stop`) runs it, forced to
stop at each depth: the launches of its per-depth graphs together (a graph a depth, one to verify), the graphs and
the host reads of stop flags it needs; against the fixed tree's one graph, where a stop could only pad. With
--vispec, each shape's cycle also with a ViSpec draft after a prompt holding an image: what its img_fc and image
tables add to EAGLE-3's cycle.
"""
from __future__ import annotations

import argparse
import collections
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import torch

from specdraft.config import PRUNE_AT, RuntimeConfig
from specdraft.core.io import write_json

CONFIGS = {  # target geometry (Hugging Face LlamaConfig fields) and the head's draft vocabulary
    "smollm2": ({"vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
                 "num_attention_heads": 9, "num_key_value_heads": 3}, 8192),
    "tiny": ({"vocab_size": 320, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
              "num_attention_heads": 4, "num_key_value_heads": 2}, 200),
}
SPEEDUP_GOAL = 2.5  # issue 3's goal over plain decoding


def parse_shape(text: str):
    """'6' -> a chain of 6; '6,8,48' -> TreeShape(6, 8, 48), validated."""
    from specdraft.core.errors import SpecdraftError
    from specdraft.decoding.tree import TreeShape

    try:
        numbers = [int(part) for part in text.split(",")]
    except ValueError:
        raise SpecdraftError(f"shape {text!r}: DEPTH (a chain) or DEPTH,TOPK,BUDGET (a tree) of integers") from None
    if len(numbers) == 1:
        return TreeShape.chain(numbers[0]).validated()
    if len(numbers) != 3:
        raise SpecdraftError(f"shape {text!r}: DEPTH (a chain) or DEPTH,TOPK,BUDGET (a tree)")
    return TreeShape(*numbers).validated()


def check_shapes(parser: argparse.ArgumentParser, texts: List[str]) -> None:
    """Every shape parsed before any work starts; a bad one is the parser's usage error."""
    from specdraft.core.errors import SpecdraftError

    for text in texts:
        try:
            parse_shape(text)
        except SpecdraftError as err:
            parser.error(str(err))


def build_engine(config: str, shape, max_len: int = 256, device: torch.device = torch.device("cpu"),
                 vispec: bool = False, **options):
    """A bf16 SpecEngine of a random Llama of `config`'s geometry and a random EAGLE-3 head (`vispec`: a ViSpec
    draft), on `device` (CUDA graphs there; none on the CPU, where the launches are counted)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from specdraft.core.types import DraftContext, TargetInfo
    from specdraft.methods.eagle3 import Eagle3Config, Eagle3Draft, Eagle3Drafter
    from specdraft.methods.vispec import VispecConfig, VispecDraft, VispecDrafter
    from specdraft.decoding.engine import SpecEngine
    from specdraft.decoding.verifier import from_hf, hf_rope_tables

    geometry, draft_vocab = CONFIGS[config]
    torch.manual_seed(0)
    hf = LlamaForCausalLM(LlamaConfig(**geometry, max_position_embeddings=max_len, tie_word_embeddings=False))
    hf = hf.eval().to(device=device, dtype=torch.bfloat16)
    info = TargetInfo.from_hf_config(hf.config, config)
    counts = torch.randint(0, 50, (info.vocab_size,))
    config_type, draft_type, drafter_type = (VispecConfig, VispecDraft, VispecDrafter) if vispec else \
        (Eagle3Config, Eagle3Draft, Eagle3Drafter)
    draft = draft_type(config_type(draft_vocab_size=draft_vocab), DraftContext(info, counts))
    draft = draft.eval().to(device=device, dtype=torch.bfloat16)
    target = from_hf(hf, info)
    return SpecEngine(target, drafter_type(draft, target), shape, max_len, hf_rope_tables(hf, max_len),
                      device.type == "cuda", **options)


def image_context(config: str, prompt_len: int, image: range) -> Dict[str, torch.Tensor]:
    """A prompt's image context for a ViSpec drafter (`Drafter.begin`): random image features on the `image` span
    of a prompt of `prompt_len` tokens (launches do not depend on the values)."""
    from specdraft.core.types import IMAGE_EMBEDS, IMAGE_MASK

    mask = torch.zeros(prompt_len, dtype=torch.bool)
    mask[image.start:image.stop] = True
    hidden = CONFIGS[config][0]["hidden_size"]
    embeds = torch.randn(prompt_len, hidden, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    return {IMAGE_EMBEDS: embeds, IMAGE_MASK: mask}


def _counted(fn, syncs: Optional[List[str]] = None):
    """fn() -> (its output, its launches); the host syncs among them appended to `syncs`."""
    from specdraft.decoding.launches import LaunchCounter

    with torch.no_grad(), LaunchCounter() as counter:
        out = fn()
    if syncs is not None:
        syncs += counter.syncs
    return out, counter.launches


def cycle_launches(engine, syncs: Optional[List[str]] = None, temperature: float = 0.0,
                   generator: Optional[torch.Generator] = None) -> Dict[str, List[str]]:
    """One cycle at `temperature` after a prefill, phase by phase as `runtime.profile` splits it -> {phase: launch
    names}; the cycle's host syncs appended to `syncs`. At T > 0 the phase `draws` holds what the host launches
    outside the cycle's graph each cycle: the random draws, and their copies into the graph's static inputs."""
    from specdraft.runtime.profile import draft_phase, verify_phase

    acceptance = engine.acceptance(temperature)
    (uniforms, draws), random = _counted(lambda: _cycle_draws(engine, acceptance, generator), syncs)
    drafted, draft = _counted(lambda: draft_phase(engine, draws), syncs)
    (tree, verified), verify = _counted(lambda: verify_phase(engine, drafted), syncs)
    _, book = _counted(lambda: engine.accept_and_commit(acceptance, tree, verified, uniforms), syncs)
    return {"draws": random, "draft": draft, "verify": verify, "bookkeeping": book}


def _cycle_draws(engine, acceptance, generator):
    """The random inputs of one cycle of the engine's shape under `acceptance`, as its cycle makes them, each copied
    once as a graph copies its arguments in -> (uniforms or None, the tree's DraftDraws or None)."""
    chain, depth = engine.chain, engine.shape.depth
    if chain is not None:
        noise = engine.draft_noise(acceptance, depth, generator)
        chain.temperature = acceptance.temperature if noise is not None else 0.0
        if noise is not None:
            chain.noise.copy_(noise)
        uniforms = acceptance.randomness(depth + 1, generator, engine.device)
        return (None if uniforms is None else uniforms.clone()), None
    args = [arg.clone() for arg in engine.cycle_args(acceptance, engine.shape.budget, generator)]  # the graph's copies
    uniforms = args[0] if args else None
    return uniforms, engine.draws(acceptance, args[1] if len(args) > 1 else None)


def pruning_scorer(beta: float, device: torch.device = torch.device("cpu")):
    """A C2T tree scorer (a classifier of random weights: launches do not depend on them) at threshold β."""
    from specdraft.core.types import DraftContext
    from specdraft.methods.c2t import C2TClassifier, C2TConfig, ClassifierScorer

    cfg = C2TConfig(draft="random", threshold=beta)
    return ClassifierScorer(C2TClassifier(cfg, DraftContext(target=None)), cfg, device)


def plain_step_launches(engine) -> List[str]:
    """One plain decoding step: the target's forward of one token and the next token's argmax."""
    from specdraft.decoding.sampling import sample_token

    return _counted(lambda: sample_token(engine.plain_step(engine.root.clone()), 0.0, None))[1]


def count(config: str, shape_texts: List[str], prune: Optional[float] = None,
          temperatures: Sequence[float] = (0.0,), point_mass: bool = False, vispec: bool = False) -> dict:
    """Each shape's cycle at each temperature (at T > 0 with sampled drafts, and with `point_mass` with point-mass
    drafts too; with `prune`, each tree shape's again with a C2T scorer at that β; with `vispec`, each shape's at
    T = 0 again with a ViSpec draft after a prompt holding an image) -> the report."""
    prompt = torch.randint(0, CONFIGS[config][0]["vocab_size"], (16,), generator=torch.Generator().manual_seed(0))
    rows, plain = [], None
    runs = [(text, None, None, t, True, False) for text in shape_texts for t in temperatures]
    runs += [(text, None, None, t, False, False) for text in shape_texts for t in temperatures if point_mass and t > 0]
    runs += [(text, prune, place, 0.0, True, False) for text in shape_texts for place in PRUNE_AT
             if prune is not None and parse_shape(text).topk > 1]
    runs += [(text, None, None, 0.0, True, True) for text in shape_texts if vispec]
    for text, beta, place, temperature, sampled, with_image in runs:
        engine = build_engine(config, parse_shape(text), tree_scorer=None if beta is None else pruning_scorer(beta),
                              prune_at=place or RuntimeConfig.prune_at, sample_drafts=sampled, vispec=with_image)
        generator = torch.Generator().manual_seed(0)
        context = image_context(config, prompt.shape[0], range(4, 12)) if with_image else None
        engine.prefill(prompt, 0.0, context=context)
        if plain is None:
            plain = plain_step_launches(engine)
            engine.prefill(prompt, 0.0)
        cycle_launches(engine, None, temperature, generator)  # builds what is cached per shape, as a warm-up does
        syncs: List[str] = []
        phases = cycle_launches(engine, syncs, temperature, generator)
        total = sum(len(names) for names in phases.values())
        drafts = "-" if temperature == 0 else ("sampled" if sampled else "point mass")
        rows.append({"shape": text, "method": "vispec" if with_image else "eagle3", "prune_threshold": beta,
                     "prune_at": place, "temperature": temperature, "drafts": drafts,
                     **{name: len(names) for name, names in phases.items()},
                     "cycle": total, "host_syncs": len(syncs), "sync_ops": sorted(set(syncs)),
                     "cycle_over_plain": total / len(plain), "tau_for_goal": SPEEDUP_GOAL * total / len(plain),
                     **{f"{name}_ops": dict(collections.Counter(names).most_common())
                        for name, names in phases.items()}})
    return {"config": config, "layers": CONFIGS[config][0]["num_hidden_layers"], "plain_step": len(plain),
            "plain_ops": dict(collections.Counter(plain).most_common()), "speedup_goal": SPEEDUP_GOAL, "rows": rows}


def depth_stop_launches(config: str, text: str, prompt: torch.Tensor) -> List[dict]:
    """The tree `text` grown by a depth-stop policy forced to stop at each depth d -> per d: launches of the whole
    cycle (the rule's own included), graphs it replays (first, d steps of which one is queued ahead, a finish),
    host reads of a stop flag."""
    from specdraft.decoding.policies.ddd import MassStop
    from specdraft.decoding.policies.stopping import StopPolicy

    shape, rows = parse_shape(text), []
    for stop in range(1, shape.depth + 1):
        rule = _ForcedStop(MassStop(0.5), stop)
        engine = build_engine(config, shape, policy=StopPolicy(rule))
        engine.prefill(prompt, 0.0)
        engine.cycle(0.0, None)  # what is cached per shape, as a graph's warm-up builds it
        rule.calls = 0
        _, launches = _counted(lambda: engine.cycle(0.0, None))
        steps = min(stop, shape.depth - 1)
        rows.append({"shape": text, "stop_depth": stop, "cycle": len(launches), "graphs": 2 + steps,
                     "flag_reads": min(stop, shape.depth - 1)})
    return rows


class _ForcedStop:
    """A stop rule that computes `rule` (its launches counted) and stops after `depth` depths."""

    def __init__(self, rule, depth: int):
        self.rule, self.depth, self.calls, self.name, self.threshold = rule, depth, 0, "forced", depth

    def tree(self, logits, frontier_scores):
        self.calls += 1
        return self.rule.tree(logits, frontier_scores) | (self.calls >= self.depth)


def table(report: dict) -> str:
    lines = [f"{report['config']} ({report['layers']} layers): a plain step launches {report['plain_step']}",
             f"{'shape':>10} {'pruned':>11} {'T':>4} {'drafts':>10} {'draws':>6} {'draft':>6} {'verify':>7} "
             f"{'bookkeeping':>12} {'cycle':>6} {'syncs':>6} {'x plain':>8} "
             f"{'tau for ' + str(report['speedup_goal']) + 'x':>12}"]
    for row in report["rows"]:
        pruned = "-" if row["prune_threshold"] is None else f"{row['prune_at'][:3]} β {row['prune_threshold']:g}"
        pruned = "vispec" if row["method"] == "vispec" else pruned
        lines.append(f"{row['shape']:>10} {pruned:>11} {row['temperature']:>4g} {row['drafts']:>10} {row['draws']:>6} "
                     f"{row['draft']:>6} {row['verify']:>7} {row['bookkeeping']:>12} {row['cycle']:>6} "
                     f"{row['host_syncs']:>6} {row['cycle_over_plain']:>8.2f} {row['tau_for_goal']:>12.2f}")
    for row in report.get("depth_stops", []):
        lines.append(f"{row['shape']:>10} stopping at depth {row['stop_depth']}: {row['cycle']} launches in "
                     f"{row['graphs']} graphs, {row['flag_reads']} flag reads")
    return "\n".join(lines)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", choices=sorted(CONFIGS), default="smollm2")
    parser.add_argument("--shapes", nargs="+", default=["6", "6,8,48", "5,8,32"],
                        help="DEPTH (a chain) or DEPTH,TOPK,BUDGET (a tree), as for tools/bench/runtime.py")
    parser.add_argument("--prune", type=float, default=None, metavar="BETA",
                        help="each tree shape also pruned by a C2T tree scorer (random weights) at this β")
    parser.add_argument("--temperatures", nargs="+", type=float, default=[0.0], metavar="T",
                        help="count each shape's cycle at each temperature (T > 0: rejection sampling, sampled drafts)")
    parser.add_argument("--point-mass", action="store_true",
                        help="at each T > 0, each shape also with point-mass drafts (sample_drafts=false)")
    parser.add_argument("--depth-stops", action="store_true",
                        help="each tree shape also grown by a depth-stop policy, stopped at each depth")
    parser.add_argument("--vispec", action="store_true",
                        help="each shape also drafted by a ViSpec draft (random weights) after a prompt with an image")
    parser.add_argument("--out", type=Path, default=Path("runs/cycle_launches"))
    args = parser.parse_args(argv)
    check_shapes(parser, args.shapes)
    report = count(args.config, args.shapes, args.prune, args.temperatures, args.point_mass, args.vispec)
    if args.depth_stops:
        prompt = torch.randint(0, CONFIGS[args.config][0]["vocab_size"], (16,),
                               generator=torch.Generator().manual_seed(0))
        report["depth_stops"] = [row for text in args.shapes if parse_shape(text).topk > 1
                                 for row in depth_stop_launches(args.config, text, prompt)]
    write_json(args.out / "cycle_launches.json", report)
    print(table(report))
    print(f"-> {args.out / 'cycle_launches.json'}")
    return report


if __name__ == "__main__":
    main()
