"""The training suite, tools/bench/train.py, in its tiny CPU configurations: every row of the step table runs and
the JSON report has its fields; each activation checkpointing mode keeps less for the backward than the one
before it. CPU."""
import json
from types import SimpleNamespace

import pytest

from tools.bench import train as bench


def test_tiny_cpu_run_writes_every_row(tmp_path, capsys):
    out = tmp_path / "bench.json"
    bench.main(["--config", "tiny", "--device", "cpu", "--seq-lens", "32", "--warmup", "1", "--steps", "1",
                "--out", str(out)])
    report = json.loads(out.read_text())
    assert {"machine", "torch", "matmul_ceiling_tflops", "reference_peak_tflops", "rows"} <= set(report)
    assert [r["row"] for r in report["rows"]] == list(bench.train_rows.ROWS)
    for row in report["rows"]:
        assert row["status"] == "ok", row
        assert row["tokens_per_s"] > 0 and row["step_ms"] > 0
        assert {"mfu_issue_vs_ceiling", "mfu_issue_vs_790", "mfu_shapes_vs_ceiling", "peak_gib_beyond_resident",
                "phases_ms", "flop_per_token"} <= set(row)
        assert set(row["phases_ms"]) == {"target", "teacher", "draft_forward", "loss", "backward", "optimizer",
                                         "other"}
    assert not any(row["compiled"] for row in report["rows"])  # train.compile=auto: eager on the CPU
    assert {row["checkpointing"] for row in report["rows"]} == {"none", "swiglu", "selective", "full"}
    assert {row["optimizer"] for row in report["rows"]} == {"adamw", "adamw8bit", "adamw8bit_fused"}
    offline = [r for r in report["rows"] if r["row"].startswith("offline")]
    assert len(offline) == 2 and all(r["phases_ms"]["target"] < 1.0 for r in offline)  # no target forward
    printed = capsys.readouterr().out
    assert "ms per step by phase" in printed and "| ours-swiglu-8bit-fused | 32 | ok |" in printed


def test_profile_adds_op_tables_to_a_row(tmp_path, capsys):
    out = tmp_path / "bench.json"
    bench.main(["--config", "tiny", "--device", "cpu", "--seq-lens", "32", "--warmup", "1", "--steps", "1",
                "--rows", "ours-no-ckpt", "--profile", "1", "--out", str(out)])
    ops = json.loads(out.read_text())["rows"][0]["ops"]
    assert ops["top_host"] and any(op["name"].startswith("aten::") for op in ops["top_host"])
    assert "ours-no-ckpt T=32, most device time" in capsys.readouterr().out


def _llama8b():
    from transformers import LlamaConfig

    from specdraft.core.types import TargetInfo

    config = bench.train_rows.CONFIGS["llama3-8b"]
    return config, TargetInfo.from_hf_config(LlamaConfig(**config["model"]), "8b")


def _train_flops(method: str, info, seq_len: int = 2048, **settings) -> dict:
    from specdraft.methods import get_method

    spec = get_method(method)
    return spec.train_flops(spec.config(**settings), info, seq_len)


def test_flop_counts_match_issue_6_at_llama_8b():
    """The shape-based count lands near the issue's 15.6 + 17.4 GFLOP per token at 2048 tokens (the teacher's
    rows and the argmax scan, 1.3 GFLOP, counted with the target there)."""
    config, info = _llama8b()
    target = sum(bench.train_rows.target_flops_per_token(info, 2048).values())
    draft = _train_flops("eagle3", info, **config["eagle3"])
    heads = draft.pop("teacher_head") + draft.pop("argmax_scan")
    assert 14.5e9 < target + heads < 16.5e9 and 15.5e9 < sum(draft.values()) < 18e9


def test_method_rows_run_and_count_their_own_flops(tmp_path):
    out = tmp_path / "bench.json"
    bench.main(["--config", "tiny", "--device", "cpu", "--seq-lens", "32", "--warmup", "1", "--steps", "1",
                "--rows", "dflash", "dflash-selective", "peagle", "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [(r["row"], r["method"], r["checkpointing"], r["status"]) for r in rows] == [
        ("dflash", "dflash", "swiglu", "ok"), ("dflash-selective", "dflash", "selective", "ok"),
        ("peagle", "peagle", "swiglu", "ok")]
    for row in rows:
        assert row["flop_per_token"]["issue"] == row["flop_per_token"]["shapes"] > 0
        assert "target_layers" in row["flop_per_token"]
    assert rows[0]["phases_ms"]["loss"] > 0  # the timer wraps DFlash's own soft cross-entropy
    assert {"draft_context", "draft_layers", "draft_lm_head"} <= set(rows[0]["flop_per_token"])
    assert {"draft_fc", "draft_layer", "draft_lm_head"} <= set(rows[2]["flop_per_token"])


def test_dflash_flop_count_at_llama_8b():
    """By hand: 512 blocks of 16 over 2048 tokens are 4 block positions a token; five layers of about 0.45 GFLOP
    a position (projections 0.08, MLP 0.35, attention 0.02), the 128K head 1.05 a position: 3 x (9.1 + 4.2) for
    forward and backward, the teacher's head 4.2 once and the context 0.75, about 44.8 GFLOP per token."""
    config, info = _llama8b()
    draft = _train_flops("dflash", info, **config["dflash"])
    assert 43e9 < sum(draft.values()) < 46.5e9, draft


def test_peagle_flop_count_at_llama_8b():
    """By hand: 7 depths under drop-token sampling (r 0.7, floor 0.2) keep 1 + 0.7 + 0.49 + 0.343 + 0.24 + 0.2 +
    0.2 = 3.17 rows a token; a row's layer on its 2H input 0.47 GFLOP (q, k, v 0.10, o 0.03, MLP 0.35) and its
    attention over half of 2048 keys 0.017, its 32K head 0.26: 3 x 3.17 x 0.75 = 7.1, the fc 0.30 and the teacher's
    rows and argmax scan 1.3 once, about 8.7 GFLOP a token: less than EAGLE-3's seven full steps."""
    config, info = _llama8b()
    peagle = sum(_train_flops("peagle", info, **config["peagle"]).values())
    eagle3 = sum(_train_flops("eagle3", info, **config["eagle3"]).values())
    assert 8e9 < peagle < 9.5e9 and peagle < 0.6 * eagle3, (peagle, eagle3)


def test_a_window_cuts_the_attention_count_not_the_rest():
    config, info = _llama8b()
    full = _train_flops("eagle3", info, 32768, **config["eagle3"])
    windowed = _train_flops("eagle3", info, 32768, **config["eagle3"], attention_window=2048)
    assert windowed["attention"] < full["attention"] / 7 and windowed["layer"] == full["layer"]


def test_out_of_memory_is_a_status_not_a_crash(monkeypatch):
    def out_of_memory(*args, **kwargs):
        raise bench.torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 9 GiB")

    monkeypatch.setattr(bench.train_rows, "Trainee", out_of_memory)
    result = bench.run_row(SimpleNamespace(cuda=False, target=None), bench.train_rows.ROWS["baseline"], 8192, 1, 1)
    assert result["status"] == "OOM"


@pytest.mark.gpu
def test_tiny_cuda_run_compiles_flex_and_runs_every_row(tmp_path):
    report = bench.main(["--config", "tiny", "--device", "cuda", "--seq-lens", "256", "--warmup", "1",
                         "--steps", "2", "--out", str(tmp_path / "bench.json")])
    assert [r["status"] for r in report["rows"]] == ["ok"] * len(bench.train_rows.ROWS)
    assert all(r["peak_gib_beyond_resident"] > 0 for r in report["rows"])


def test_each_mode_keeps_less_than_the_one_before(tmp_path, capsys):
    out = tmp_path / "activations.json"
    bench.main(["activations", "--config", "tiny", "--out", str(tmp_path)])
    rows = {row["mode"]: row for row in json.loads(out.read_text())["rows"]}
    assert list(rows) == ["none", "swiglu", "selective", "full"]
    layer = [rows[mode]["layer"] for mode in rows]
    assert layer[0] > layer[1] > layer[2] > layer[3] > 0
    assert rows["selective"]["head_loss"] < rows["none"]["head_loss"]
    assert rows["full"]["weight_casts"] == 0
    assert "kept for the backward" in capsys.readouterr().out


def test_the_compiled_layer_keeps_no_more_than_the_eager_one(tmp_path):
    """train.compile casts the layer's weights outside the compiled parts, once per unroll: it keeps one bf16
    copy of each for the backward, as eager autocast does, not one per TTT step."""
    kept = {}
    for flags in ([], ["--compile"]):
        out = tmp_path / f"activations{len(flags)}.json"
        bench.main(["activations", "--config", "tiny", "--modes", "none", "selective", *flags, "--out", str(out)])
        rows = json.loads(out.read_text())["rows"]
        kept[bool(flags)] = {row["mode"]: row["layer"] + row["weight_casts"] for row in rows}
    assert all(kept[True][mode] <= kept[False][mode] for mode in ("none", "selective")), kept
