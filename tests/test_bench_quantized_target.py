"""The quantization suite's `decode` and `heads` parts on tiny targets, CPU (kernels' references): every row
measured and written, both heads trained on their own target's data and benched lossless for the int4 target.
A check that the suite runs, not a measurement (tools/bench/quantization.py; its `training` part:
tests/test_quantization.py)."""
import json

import pytest
import torch

from tests.test_train_export_eval import make_recipe
from tools.bench import quantization as suite

pytestmark = pytest.mark.reference_kernels


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """torch on one thread (conftest's `one_thread`, for the module's fixtures too): small CPU ops ran many times
    slower on two threads of a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_decode_measures_each_setting(tmp_path, capsys):
    report = suite.main(["decode", "--geometry", "tiny", "--tokens", "8", "--prompt-len", "8", "--out",
                         str(tmp_path)])
    rows = {row["weights"]: row for row in report["rows"]}
    assert set(rows) == {"bf16", "int8", "int4"} and all(row["step_ms"] > 0 for row in rows.values())
    assert rows["int4"]["bytes_a_step"] < rows["int8"]["bytes_a_step"] < rows["bf16"]["bytes_a_step"]
    assert json.loads((tmp_path / "decode.json").read_text())["geometry"] == "tiny"
    assert "| weights | GiB a step |" in capsys.readouterr().out


def _heads_args(tmp_path, tiny_target_dir) -> list:
    """`heads` on the tiny target: three prompts distilled, two steps trained, one prompt of 8 tokens benched."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("hello", "z", "add 2 and 2")))
    recipe = make_recipe(tmp_path, tiny_target_dir, tmp_path / "unused")
    return ["heads", str(recipe), f"data.prompts=[{prompts}]", "data.max_length=256", "data.val_fraction=0.34",
            "distill.max_new_tokens=8", "distill.batch_size=3", "--work", str(tmp_path / "work"), "--out",
            str(tmp_path / "out"), "--steps", "2", "--micro-batch", "2", "--prompts", str(prompts), "--max-prompts",
            "1", "--max-new-tokens", "8", "--lossless-prompts", "1", "--max-len", "128", "--device", "cpu"]


@pytest.fixture(scope="module")
def heads(tmp_path_factory, tiny_target_dir):
    """(the `heads` report, its arguments, its directory): both heads distilled, trained, exported and benched, the
    int4 head once more with hierarchical drafting (the tiny target as the small model)."""
    tmp_path = tmp_path_factory.mktemp("heads")
    args = [*_heads_args(tmp_path, tiny_target_dir), "--intermediate", str(tiny_target_dir)]  # its own small model
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPECDRAFT_KERNELS", "reference")
        return suite.main(args), args, tmp_path


def test_heads_train_on_their_own_targets_and_bench_lossless(heads):
    report, args, tmp_path = heads
    assert [(row["head"], row["target"], row["intermediate"]) for row in report["rows"]] == [
        ("none", "none", None), ("none", "int4", None), ("int4", "int4", None), ("int4", "int4", args[-1])]
    assert all(row["lossless_float32"] == "1/1" and row["tau"] >= 1 and row["prompts"] == 1 for row in report["rows"])
    for setting in ("none", "int4"):
        config = json.loads((tmp_path / "work" / setting / "export" / "config.json").read_text())
        assert config["specdraft"]["target_config"]["quantization"] == setting
    assert set(report["heads"]) == {"none", "int4"}
    assert json.loads((tmp_path / "out" / "heads.json").read_text())["rows"] == report["rows"]
    assert "| head trained on | decoding for |" in suite.heads_table(report["rows"])


def test_a_rerun_keeps_the_trained_heads(heads, monkeypatch):
    _, args, tmp_path = heads
    monkeypatch.setattr("specdraft.distill.run.run_distill", lambda recipe: pytest.fail("distilled again"))
    parsed = suite.heads_args(args[1:])
    work = tmp_path / "work"
    assert suite.trained_head(parsed.recipe, "int4", work, parsed, parsed.overrides) == work / "int4" / "export"


@pytest.mark.gpu
def test_on_a_gpu_the_triton_kernels_decode_in_cuda_graphs(heads, tmp_path, monkeypatch):
    """Both parts as the GPU command runs them (Triton kernels, CUDA graphs), on small shapes."""
    monkeypatch.delenv("SPECDRAFT_KERNELS")
    report = suite.main(["decode", "--geometry", "smollm2", "--tokens", "16", "--prompt-len", "16", "--device", "cuda",
                         "--out", str(tmp_path)])
    rows = {row["weights"]: row for row in report["rows"]}
    assert rows["int4"]["bytes_a_step"] < rows["bf16"]["bytes_a_step"] and report["copy_gbps"] > 0
    _, args, work_dir = heads
    parsed = suite.heads_args([*args[1:], "--device", "cuda", "--max-len", "256"])
    row = suite.bench_head(work_dir / "work" / "int4" / "export", "int4", None, parsed, tmp_path / "bench")
    assert row["lossless_float32"] == "1/1" and row["tau"] >= 1
