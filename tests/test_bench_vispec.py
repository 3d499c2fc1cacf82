"""The ViSpec suite, tools/bench/vispec.py, on a tiny random LLaVA with a drawn-image prompt folder laid out as
tools/build_small_vlm.py writes it (CPU, float32): distill with and without the answer instruction, ViSpec and
EAGLE-3 trained on the same data, steps and seed, both benched against plain decoding; its tables and JSON."""
import json

from tests.tiny_vlm import drawn_image, save_tiny_vlm
from tests.tools import load_tool


def prompt_folder(folder, counts):
    """prompts/<split>.jsonl in LLaVA's form with drawn images under prompts/images/."""
    (folder / "images").mkdir(parents=True)
    for split, count in counts.items():
        lines = []
        for number in range(count):
            name = f"images/{split}-{number:05d}.png"
            drawn_image(100 * len(split) + number, (32 + 8 * (number % 2), 32)).save(folder / name)
            lines.append({"id": f"{split}-{number}", "image": name,
                          "conversations": [{"from": "human", "value": "<image>\nDescribe this image."},
                                            {"from": "gpt", "value": "a reference"}]})
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_the_suite_regenerates_trains_both_drafts_and_benches_them(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SPECDRAFT_KERNELS", "reference")
    vlm = save_tiny_vlm(tmp_path / "vlm", "llava")
    prompt_folder(vlm / "prompts", {"distill": 6, "test": 2})
    suite = load_tool("bench/vispec")
    report = suite.main([str(vlm), "--out", str(tmp_path / "out"), "--distill-prompts", "6", "--length-prompts", "3",
                         "--max-new-tokens", "8", "--steps", "2", "--batch", "2", "--bench-prompts", "2",
                         "--bench-new-tokens", "8", "--lossless-prompts", "2", "--device", "cpu", "--dtype",
                         "float32", "--max-len", "256", "data.max_length=256", "distill.batch_size=4",
                         "distill.shard_size=4", "method.ttt_steps=2", "method.draft_vocab_size=256",
                         "data.val_fraction=0.3"])
    lengths = report["lengths"]
    assert lengths["without"]["answers"] == lengths["with"]["answers"] == 3
    assert lengths["with_all_prompts"]["answers"] == 6 and lengths["instruction"].startswith("Please answer")
    assert report["distill"]["ok"] == 6
    assert set(report["runs"]) == {"vispec", "eagle3"}
    for name, run in report["runs"].items():
        assert run["method"] == name and run["train"]["steps"] == 2
        bench = run["bench"]
        assert bench["tau"] >= 1.0 and bench["lossless"] is True and bench["prompts"] == 2
        assert bench["lossless_float32"]["identical"] == 2
    recipes = {name: (tmp_path / "out" / name / "train" / "recipe.yaml").read_text() for name in ("vispec", "eagle3")}
    assert "num_queries" in recipes["vispec"] and "num_queries" not in recipes["eagle3"]
    assert all(f"output_dir: {tmp_path / 'out' / 'data'}" in text for text in recipes.values())  # the same data
    assert report["tau_ratio"] is not None
    assert json.loads((tmp_path / "out" / "vispec.json").read_text())["tau_ratio"] == report["tau_ratio"]
    printed = capsys.readouterr().out
    assert "| with, same prompts | 3 |" in printed and "| vispec | 2 |" in printed and "τ(ViSpec) / τ(EAGLE-3)" in printed
