"""tools/draft_vocab_coverage.py on the tiny target: the coverage of the training answers is what the draft
vocabulary's counts give, both columns grow with the size, and the whole vocabulary covers everything."""
import json

from tests.test_train_export_eval import make_recipe
from tools import draft_vocab_coverage as coverage_tool


def test_coverage_grows_to_one_at_the_whole_vocabulary(tmp_path, tiny_target_dir, distilled):
    recipe = make_recipe(tmp_path, tiny_target_dir, distilled)
    vocab_size = json.loads((tiny_target_dir / "config.json").read_text())["vocab_size"]
    report = coverage_tool.main([str(recipe), "--sizes", f"4,16,{vocab_size}", "--max-prompts", "2",
                                 "--max-new-tokens", "6", "--device", "cpu", "--out", str(tmp_path / "out")])
    rows = report["rows"]
    assert [row["draft_vocab_size"] for row in rows] == [4, 16, vocab_size]
    for column in ("train_answers", "eval_answers"):
        values = [row[column] for row in rows]
        assert values == sorted(values) and values[-1] == 1.0 and values[0] < 1
    assert rows[0]["train_answers"] > 0  # the 4 most frequent answer tokens
    assert report["eval_answer_tokens"] == 12
    assert json.loads((tmp_path / "out" / "draft_vocab_coverage.json").read_text()) == report
