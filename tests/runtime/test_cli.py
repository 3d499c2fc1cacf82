"""`specdraft generate` and `specdraft bench` end to end on a tiny trained draft, and their bad inputs."""
import json
import shutil
import statistics
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from specdraft import cli
from tests.test_train_export_eval import make_recipe


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory, tiny_target_dir, distilled):
    tmp = tmp_path_factory.mktemp("runtime_cli")
    recipe = make_recipe(tmp, tiny_target_dir, distilled, max_steps=10, val_every_steps=10)
    assert cli.main(["train", str(recipe)]) == 0
    assert cli.main(["export", str(tmp / "run"), "--format", "hf", "--out", str(tmp / "hf")]) == 0
    return tmp / "hf"


def test_generate_prints_the_completion_alone(export_dir, capsys):
    assert cli.main(["generate", str(export_dir), "--prompt", "question 1?", "--max-new-tokens", "12",
                     "--device", "cpu", "--max-len", "256"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() and "{" not in out and "tokens/s" in err


def test_bench_writes_json_plot_and_trace(export_dir, tmp_path, capsys):
    prompts = export_dir.parent / "eval.jsonl"
    assert cli.main(["bench", str(export_dir), "--prompts", str(prompts), "--max-new-tokens", "10", "--device",
                     "cpu", "--max-len", "256", "--depth", "3", "--topk", "2", "--budget", "6",
                     "--out", str(tmp_path), "--trace"]) == 0
    report = json.loads((tmp_path / "bench.json").read_text())
    captured = capsys.readouterr()
    printed = json.loads(captured.out)  # stdout: the summary's JSON alone
    assert printed == {k: report[k] for k in ("tau", "tokens_per_s", "speedup_vs_plain", "speedup_vs_hf",
                                              "lossless_float32", "float32_matches_plain")}
    assert report["lossless_float32"] is True and [r["temperature"] for r in report["runs"]] == [0.0, 1.0]
    assert report["runs"][0]["plain_matches_hf_prompts"] == report["runs"][0]["prompts"]
    prompts_run = report["runs"][0]["prompts"]  # a float32 run's own T=0 comparison is the check
    assert report["float32_matches_plain"] == f"{prompts_run}/{prompts_run}"
    assert report["float32_check"] == {"dtype": "float32", "prompts": min(10, prompts_run),
                                       "identical": min(10, prompts_run), "lossless": True, "reused_timed_run": True,
                                       "divergences": []}
    profile = report["cycle_profile"]
    assert set(profile["eager_ms"]) == {"draft", "verify", "bookkeeping"} and profile["graph_split_ms"] is None
    assert profile["eager_cycle_ms"] == pytest.approx(sum(profile["eager_ms"].values()))  # the phases add up
    eager = next(line for line in captured.err.splitlines() if line.startswith("cycle, phase by phase"))
    assert eager.endswith(f" = {profile['eager_cycle_ms']:.3f} ms") and " + verify " in eager
    assert "cycle as the engine runs it: " in captured.err and "shares of the eager cycle: draft" in captured.err
    assert set(profile["host_load"]) == {"before", "after"}  # its two timings are apart: the load around them
    for name in ("cycle", "plain"):  # the host issues each call before the device's end of it
        host, whole = profile[f"{name}_host_ms"], profile[f"{name}_ms" if name == "cycle" else "plain_step_ms"]
        assert 0 < host <= whole, (name, host, whole)
    assert report["settings"]["overlap"] is True
    per_prompt = report["runs"][0]["per_prompt"]  # the totals, prompt by prompt
    assert len(per_prompt) == prompts_run and all(p["prompt_len"] > 0 for p in per_prompt)
    assert sum(p["plain_tokens"] for p in per_prompt) == report["runs"][0]["new_tokens"]["plain"]
    assert sum(p["spec_cycles"] for p in per_prompt) == report["runs"][0]["cycles"]
    assert abs(sum(p["spec_s"] for p in per_prompt) - report["runs"][0]["seconds"]["spec"]) < 1e-6
    buckets, run = report["runs"][0]["tau_by_context"], report["runs"][0]  # τ by prompt length adds up to τ
    assert sum(b["cycles"] for b in buckets) == run["cycles"] and sum(b["prompts"] for b in buckets) == prompts_run
    assert sum(b["tau"] * b["cycles"] for b in buckets) == pytest.approx(run["tau"] * run["cycles"])
    assert report["settings"]["draft_state_bytes"] > 0 and report["settings"]["max_len"] == 256
    warmup = report["runs"][0]["prompt_warmup"]  # every prompt prefilled twice before the timed loops
    assert warmup["prompts"] == prompts_run and warmup["prefill_first_ms"] > 0 and warmup["prefill_again_ms"] > 0
    load = report["runs"][0]["host_load"]
    assert load["cpus"] >= 1 and load["before"] >= 0 and load["after"] >= 0
    assert (tmp_path / "bench.png").stat().st_size > 0
    rows = [json.loads(line) for line in (tmp_path / "trace.jsonl").read_text().splitlines()]
    assert rows and {"tokens", "parents", "draft_logprobs", "accepted_nodes"} <= set(rows[0])
    assert all(run["tree"] == {"depth": 3, "topk": 2, "budget": 6} for run in report["runs"])  # asked: every T
    assert report["settings"]["sampling_tree"] is None
    assert "| T | tree | τ |" in captured.err


def test_the_hf_baseline_on_the_first_prompts_alone(export_dir, tmp_path):
    """--hf-prompts N: Hugging Face decodes the first N prompts; its speedups compare the three on those prompts."""
    prompts = export_dir.parent / "eval.jsonl"
    assert cli.main(["bench", str(export_dir), "--prompts", str(prompts), "--max-new-tokens", "6", "--device", "cpu",
                     "--max-len", "256", "--chain", "--depth", "2", "--temperature", "0", "--hf-prompts", "1",
                     "--lossless-prompts", "0", "--out", str(tmp_path)]) == 0
    run = json.loads((tmp_path / "bench.json").read_text())["runs"][0]
    first = run["per_prompt"][0]
    assert run["prompts"] > 1 and run["hf_prompts"] == 1 and run["plain_matches_hf_prompts"] == 1
    hf_rate = run["new_tokens"]["hf"] / run["seconds"]["hf"]
    assert run["new_tokens"]["hf"] == first["plain_tokens"]  # greedy: HF's answer is plain decoding's
    assert abs(run["speedup_vs_hf"] - first["spec_tokens"] / first["spec_s"] / hf_rate) < 1e-9
    assert abs(run["plain_vs_hf"] - first["plain_tokens"] / first["plain_s"] / hf_rate) < 1e-9
    assert cli.main(["bench", str(export_dir), "--device", "cpu", "--hf-prompts", "0", "--out", str(tmp_path)]) == 2


def test_an_export_of_nan_weights_changes_no_token_of_generate(export_dir, tmp_path, capsys):
    """Issue 52's export, every float of its model.safetensors NaN: `generate` prints the target's own answer (the
    intact draft's, lossless) as a tree and as a chain."""
    from safetensors.torch import load_file, save_file

    broken = tmp_path / "nan_export"
    shutil.copytree(export_dir, broken)
    tensors = load_file(broken / "model.safetensors")
    save_file({name: torch.full_like(t, float("nan")) if t.is_floating_point() else t for name, t in tensors.items()},
              broken / "model.safetensors", metadata={"format": "pt"})
    answers = []
    for draft, shape in ((export_dir, []), (broken, []), (broken, ["--chain"])):
        assert cli.main(["generate", str(draft), "--prompt", "question 1?", "--max-new-tokens", "8", "--device", "cpu",
                         "--max-len", "256", *shape]) == 0
        answers.append(capsys.readouterr().out)
    assert answers[0].strip() and answers[1] == answers[0] and answers[2] == answers[0]


def test_a_bf16_bench_checks_its_draft_in_float32(export_dir, tmp_path, capsys):
    prompts = export_dir.parent / "eval.jsonl"
    assert cli.main(["bench", str(export_dir), "--prompts", str(prompts), "--max-new-tokens", "8", "--device", "cpu",
                     "--dtype", "bfloat16", "--max-len", "256", "--depth", "3", "--topk", "2", "--budget", "6",
                     "--temperature", "0", "--no-hf", "--lossless-prompts", "2", "--no-overlap", "--out",
                     str(tmp_path)]) == 0
    report = json.loads((tmp_path / "bench.json").read_text())
    assert report["settings"]["dtype"] == "bfloat16" and report["settings"]["overlap"] is False
    assert report["float32_check"] == {"dtype": "float32", "prompts": 2, "identical": 2, "lossless": True,
                                       "reused_timed_run": False, "divergences": []}
    assert report["lossless_float32"] is True and report["bfloat16_matches_plain"].endswith("/3")  # every prompt
    printed = capsys.readouterr()
    assert "lossless in float32 (speculative == plain, T=0, decoded again in float32): 2/2 prompts" in printed.err
    assert json.loads(printed.out)["lossless_float32"] is True


def test_the_float32_check_records_where_outputs_part(export_dir, tmp_path):
    from specdraft.runtime.bench import BenchSettings, lossless_in_float32
    from specdraft.decoding.outputs import GenerationResult
    from specdraft.config import RuntimeConfig
    from specdraft.runtime.load import load_runtime

    runtime = load_runtime(export_dir, RuntimeConfig(device="cpu", dtype="float32", max_len=256))
    generate = runtime.engine.generate

    def one_token_off(prompt_ids, *args, **kwargs):  # a broken speculative decoder: its 4th token differs
        result = generate(prompt_ids, *args, **kwargs)
        return GenerationResult(tokens=result.tokens[:3] + [result.tokens[3] + 1] + result.tokens[4:])

    runtime.engine.generate = one_token_off
    prompts = [[1, 2, 3], [4, 5, 6, 7]]
    check = lossless_in_float32(runtime, prompts, BenchSettings(max_new_tokens=6, lossless_prompts=5), None)
    assert check["prompts"] == 2 and check["identical"] == 0 and check["lossless"] is False
    assert check["divergences"] == [{"prompt": 0, "position": 3}, {"prompt": 1, "position": 3}]
    assert lossless_in_float32(runtime, prompts, BenchSettings(lossless_prompts=0), None) is None


def test_bad_runtime_inputs_are_one_line_errors(export_dir, tmp_path, capsys):
    plain_model_dir = tmp_path / "not_an_export"
    plain_model_dir.mkdir()
    (plain_model_dir / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    assert cli.main(["generate", str(plain_model_dir), "--prompt", "x", "--device", "cpu"]) == 2
    assert "not an export specdraft can run" in capsys.readouterr().err
    assert cli.main(["generate", str(export_dir), "--prompt", "x " * 300, "--device", "cpu", "--max-len",
                     "128"]) == 2
    assert "cache" in capsys.readouterr().err
    assert cli.main(["generate", str(export_dir), "--prompt", "x", "--device", "cpu", "--budget", "500"]) == 2
    assert "budget" in capsys.readouterr().err
    assert cli.main(["generate", str(export_dir), "--prompt", "x", "--device", "cpu", "--shallow-reuse-tree"]) == 2
    assert "Kangaroo" in capsys.readouterr().err  # an EAGLE-3 draft runs no shallow layers of the target
    assert cli.main(["generate", str(export_dir), "--prompt", "x", "--device", "cpu", "--chain",
                     "--shallow-reuse-tree"]) == 2
    assert "applies to trees" in capsys.readouterr().err


def test_a_draft_for_another_target_is_refused(export_dir, tmp_path, capsys):
    from specdraft.testing.tiny import save_tiny_target, tiny_llama_config
    from transformers import LlamaForCausalLM

    other = save_tiny_target(tmp_path / "other")
    config = tiny_llama_config(hidden=32)
    LlamaForCausalLM(config).save_pretrained(other)  # same tokenizer, other hidden size
    assert cli.main(["generate", str(export_dir), "--prompt", "x", "--device", "cpu", "--target", str(other)]) == 2
    assert "hidden_size" in capsys.readouterr().err


@pytest.mark.parametrize("field_name, geometry", [("num_layers", {"layers": 6}), ("num_kv_heads", {"kv_heads": 4})])
def test_a_draft_for_a_target_of_other_depth_or_heads_is_refused(export_dir, tmp_path, capsys, field_name, geometry):
    from specdraft.testing.tiny import save_tiny_target, tiny_llama_config
    from transformers import LlamaForCausalLM

    other = save_tiny_target(tmp_path / "other")
    LlamaForCausalLM(tiny_llama_config(**geometry)).save_pretrained(other)  # same vocabulary and width
    assert cli.main(["generate", str(export_dir), "--prompt", "x", "--device", "cpu", "--target", str(other)]) == 2
    assert f"{field_name}=" in capsys.readouterr().err


def _moved_export(export_dir: Path, out: Path, recorded: bool) -> Path:
    """A copy of the export as another machine sees it: the target it records is not there; `recorded`: config.json
    keeps the target geometry and settings exports record (False: an export from before they did)."""
    shutil.copytree(export_dir, out)
    elsewhere = str(out / "elsewhere" / "target")
    recipe = OmegaConf.load(out / "recipe.yaml")
    recipe.target.path = elsewhere
    OmegaConf.save(recipe, out / "recipe.yaml")
    config = json.loads((out / "config.json").read_text())
    config["specdraft"]["target"] = config["specdraft"]["target_config"]["path"] = elsewhere
    if not recorded:
        for key in ("target_info", "target_config", "runtime"):
            del config["specdraft"][key]
    (out / "config.json").write_text(json.dumps(config))
    return out


@pytest.mark.parametrize("recorded", [True, False], ids=["records-its-target", "older-export"])
def test_an_export_from_another_machine_runs_with_target(export_dir, tiny_target_dir, tmp_path, capsys, recorded):
    moved = _moved_export(export_dir, tmp_path / "moved", recorded)
    argv = ["generate", str(moved), "--prompt", "question 1?", "--max-new-tokens", "6", "--device", "cpu"]
    assert cli.main(argv) == 2
    assert "elsewhere" in capsys.readouterr().err  # names the recipe's target, which is missing
    assert cli.main([*argv, "--target", str(tiny_target_dir)]) == 0
    assert capsys.readouterr().out.strip()


def test_an_older_export_for_another_target_is_refused_cleanly(export_dir, tmp_path, capsys):
    from specdraft.testing.tiny import save_tiny_target, tiny_llama_config
    from transformers import LlamaForCausalLM

    other = save_tiny_target(tmp_path / "other")
    LlamaForCausalLM(tiny_llama_config(hidden=32)).save_pretrained(other)
    moved = _moved_export(export_dir, tmp_path / "moved", recorded=False)
    assert cli.main(["generate", str(moved), "--prompt", "x", "--device", "cpu", "--target", str(other)]) == 2
    assert "does not fit a draft for" in capsys.readouterr().err


def test_runtime_suite_benches_every_shape_against_its_own_plain_run(export_dir, tmp_path, capsys):
    """The runtime suite (tools/bench/runtime.py): one row per shape (a chain, a tree), each lossless with its own
    plain rate, cycle time and loop costs, each shape's bench.json beside the suite's JSON; a bad shape stops it
    before any bench, naming the form."""
    from tools.bench import runtime as suite

    report = suite.main([str(export_dir), "--shapes", "3", "3,2,6", "--prompts", str(export_dir.parent / "eval.jsonl"),
                         "--max-new-tokens", "10", "--lossless-prompts", "1", "--device", "cpu", "--out",
                         str(tmp_path)])
    rows = {row["shape"]: row for row in report["rows"]}
    assert set(rows) == {"3", "3,2,6"} and (rows["3"]["topk"], rows["3,2,6"]["budget"]) == (1, 6)
    assert all(row["lossless_prompts"] == row["prompts"] > 0 and row["tokens_per_s_plain"] > 0 for row in rows.values())
    assert all(row["lossless_float32"]["identical"] == 1 and row["cycle_ms"] > 0 and row["loop"]["spec_cycle_ms"] > 0
               for row in rows.values())
    median_plain = statistics.median(row["tokens_per_s_plain"] for row in rows.values())
    assert all(row["speedup_vs_median_plain"] == pytest.approx(row["tokens_per_s"] / median_plain)
               for row in rows.values())
    assert json.loads((tmp_path / "runtime.json").read_text())["rows"] == report["rows"]
    assert (tmp_path / "runtime" / "3-2-6" / "bench.json").exists()
    assert "| shape | τ | spec tok/s |" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        suite.main([str(export_dir), "--shapes", "3", "3,2", "--prompts", "p", "--out", str(tmp_path)])
    assert "'3,2': DEPTH (a chain) or DEPTH,TOPK,BUDGET" in capsys.readouterr().err


@pytest.mark.parametrize("flags, expected, sampling", [
    ([], (5, 8, 40), (3, 6, 16)),  # the default trees (the fastest shapes measured on SmolLM2, docs/benchmarks.md)
    (["--chain"], (6, 1, 7), None),  # a chain's default depth stays 6
    (["--chain", "--depth", "3"], (3, 1, 4), None),
    (["--depth", "7", "--budget", "60"], (7, 8, 60), None),  # a shape asked for holds at every temperature
    (["--topk", "4"], (5, 4, 40), None),
    (["--policy", "sam"], (5, 8, 40), None),  # a drafting policy drafts from the one shape
    (["--policy", "adaptive"], (7, 8, 40), None),  # the adaptive policy's deepest tree
    (["--policy", "adaptive", "--depth", "6"], (6, 8, 40), None),
])
def test_runtime_shape_defaults(monkeypatch, flags, expected, sampling):
    """The shapes `generate` and `bench` ask for: trees of (5, 8, 40) at T=0 and (3, 6, 16) at T > 0 by default, a
    chain of 6 with --chain, and the shape given at every temperature once any of it is given."""
    from specdraft.runtime.load import sampling_tree_shape, tree_shape

    args = cli.build_parser().parse_args(["generate", "EXPORT", "--prompt", "x", *flags])
    shape, sampling_shape = tree_shape(cli.runtime_config(args)), sampling_tree_shape(cli.runtime_config(args))
    assert (shape.depth, shape.topk, shape.budget) == expected
    assert sampling == (None if sampling_shape is None else
                        (sampling_shape.depth, sampling_shape.topk, sampling_shape.budget))


def test_bench_with_no_shape_asked_runs_each_temperatures_default_tree(export_dir, tmp_path):
    prompts = export_dir.parent / "eval.jsonl"
    assert cli.main(["bench", str(export_dir), "--prompts", str(prompts), "--max-new-tokens", "6", "--device", "cpu",
                     "--max-len", "256", "--max-prompts", "2", "--no-hf", "--lossless-prompts", "0",
                     "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "bench.json").read_text())
    trees = {run["temperature"]: run["tree"] for run in report["runs"]}
    assert trees == {0.0: {"depth": 5, "topk": 8, "budget": 40}, 1.0: {"depth": 3, "topk": 6, "budget": 16}}
    assert report["settings"]["sampling_tree"] == trees[1.0]


@pytest.mark.parametrize("chain", [True, False])
def test_the_profile_phases_make_one_cycle(export_dir, chain):
    """The three phases the GPU profile captures one graph each, run in order, commit what one cycle commits."""
    import torch

    from specdraft.config import RuntimeConfig
    from specdraft.runtime.load import load_runtime
    from specdraft.runtime.profile import cycle_phases

    shape = dict(depth=3, chain=True) if chain else dict(depth=3, topk=2, budget=6)
    engines = [load_runtime(export_dir, RuntimeConfig(device="cpu", dtype="float32", max_len=256, **shape)).engine
               for _ in range(2)]
    prompt = torch.tensor([5, 9, 14, 3, 7])
    for engine in engines:
        engine.prefill(prompt, 0.0)
    for _ in range(3):
        with torch.no_grad():  # as the engine's loops run
            expected = engines[0].cycle(0.0, None).output
            got = [fn() for _, fn in cycle_phases(engines[1])][-1]
        assert torch.equal(got.for_host, expected.for_host)
        assert torch.equal(engines[1].prefix_len, engines[0].prefix_len)
        assert torch.equal(engines[1].root, engines[0].root)


TRAINER_ONLY = ("lightning", "lightning_fabric", "pytorch_lightning", "deepspeed", "datasets", "omegaconf", "peft",
                "bitsandbytes")


def test_the_runtime_runs_without_the_trainers_dependencies(export_dir, tmp_path):
    """A serving machine needs torch, triton, safetensors, transformers and a tokenizer: `generate` on an export runs
    with none of lightning, deepspeed, datasets, omegaconf, peft or bitsandbytes importable."""
    import subprocess
    import sys

    import torch

    site = tmp_path / "site"  # this environment's packages, the trainer's left out
    site.mkdir()
    for entry in Path(torch.__file__).resolve().parents[1].iterdir():
        if not entry.name.startswith((*TRAINER_ONLY, "__editable__")):
            (site / entry.name).symlink_to(entry)
    code = (f"import sys\nfrom specdraft import cli\n"
            f"code = cli.main(['generate', {str(export_dir)!r}, '--prompt', 'question 1?', '--max-new-tokens', '6',"
            f" '--device', 'cpu'])\n"
            f"loaded = {{m.split('.')[0] for m in sys.modules}} & set({TRAINER_ONLY!r})\n"
            f"print('LOADED', sorted(loaded))\nsys.exit(code)\n")
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": f"{site}:{repo}", "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "LOADED []" in done.stdout and "tokens/s" in done.stderr
