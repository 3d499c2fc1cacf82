"""distill.engine=server against a real server: llama.cpp's OpenAI-compatible server (llama-cpp-python) serving the
embedded SmolLM2 GGUF on the CPU, on a loopback port (specdraft/testing/llama_server.py). A few prompts distilled
through it, greedy answers equal to the server's own when asked directly, a prompt longer than its context as that
prompt's error, and the server killed mid-run, then a resume: every prompt accounted once. Skipped without
llama-cpp-python[server]."""
import json
import threading
import time

import pytest
from datasets import load_from_disk

from specdraft.core.errors import SpecdraftError
from specdraft.data.format import dataset_dir, shards_dir
from specdraft.distill.run import run_distill
from specdraft.recipes import load_recipe
from specdraft.testing.llama_server import SMOLLM2, LlamaServer, missing_reason

pytestmark = pytest.mark.skipif(missing_reason() is not None, reason=missing_reason() or "")

PROMPTS = ["What is 2 + 2?", "Name a primary colour.", "Say hello in French."]
TOO_LONG = "word " * 600  # beyond the server's 512-token context, well within data.max_length


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with LlamaServer(log=tmp_path_factory.mktemp("llama_server") / "server.log") as running:
        yield running


@pytest.fixture(scope="module")
def tokenizer():
    from specdraft.config import TargetConfig
    from specdraft.targets.load import load_chat_tokenizer

    return load_chat_tokenizer(TargetConfig(path=SMOLLM2))[0]


def make_recipe(tmp_path, url, prompts, overrides=()):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": prompt}) + "\n" for prompt in prompts))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"target: {{path: '{SMOLLM2}'}}\nmethod: {{name: eagle3}}\n"
                      f"data: {{prompts: [{path}], max_length: 2048}}\n"
                      f"distill: {{output_dir: {tmp_path / 'out'}, max_new_tokens: 16, shard_size: 2, engine: server,"
                      f"\n  server: {{url: '{url}', concurrency: 2}}}}\n")
    return load_recipe(recipe, list(overrides))


def answers(out, tokenizer) -> dict:
    """{conversation index: (its prompt's text, its answer's text)} from the dataset's rows."""
    found = {}
    for row in load_from_disk(str(dataset_dir(out))):
        text = tokenizer.decode(row["input_ids"])
        answer = tokenizer.decode([t for t, m in zip(row["input_ids"], row["loss_mask"]) if m])
        assert answer.endswith("<|im_end|>\n")
        found[row["index"]] = (text[:len(text) - len(answer)], answer[:-len("<|im_end|>\n")])
    return found


def test_greedy_answers_are_the_servers_own(tmp_path, server, tokenizer):
    assert run_distill(make_recipe(tmp_path, server.url, PROMPTS)) == {"input": 3, "ok": 3, "error": 0, "skipped": 0}
    distilled = answers(tmp_path / "out", tokenizer)
    assert sorted(distilled) == [0, 1, 2]
    for prompt, answer in distilled.values():
        assert prompt.endswith("<|im_start|>assistant\n") and answer
        assert answer == server.complete(prompt, 16)["text"]  # the same server asked directly, greedy
    throughput = json.loads((tmp_path / "out" / "throughput.json").read_text())
    assert throughput["server"]["api"] == "llama-cpp-python" and throughput["server"]["answered"] == 3
    assert throughput["tokens_per_s"] > 0 and throughput["server"]["latency_p90_s"] > 0


def test_a_prompt_beyond_the_servers_context_is_its_error(tmp_path, server):
    counts = run_distill(make_recipe(tmp_path, server.url, [PROMPTS[0], TOO_LONG]))
    assert counts == {"input": 2, "ok": 1, "error": 1, "skipped": 0}
    error = json.loads((tmp_path / "out" / "errors.jsonl").read_text())
    assert error["index"] == 1 and error["reason"].startswith("server answered 400: This model's maximum context "
                                                              "length is 512 tokens")


def test_a_server_killed_mid_run_loses_nothing_and_the_rerun_resumes(tmp_path, tokenizer):
    prompts = [f"Give me one word about the number {i}." for i in range(6)]
    first = LlamaServer(log=tmp_path / "server.log").start()
    recipe = make_recipe(tmp_path, first.url, prompts, ["distill.server.retries=1", "distill.server.backoff=0.2"])
    shards = shards_dir(tmp_path / "out")

    def kill_after_the_first_shard():
        while not (shards / "shard-00000").is_dir():
            time.sleep(0.05)
        first.kill()

    killer = threading.Thread(target=kill_after_the_first_shard, daemon=True)
    killer.start()
    try:
        with pytest.raises(SpecdraftError, match=r"it stopped answering .*; distill-data stopped with [12] of its 3 "
                                                 r"shards written"):
            run_distill(recipe)
    finally:
        first.stop()
    kept = sorted(path.name for path in shards.glob("shard-*"))
    with LlamaServer(log=tmp_path / "server.log") as second:  # another server, another port: the URL is no setting
        counts = run_distill(make_recipe(tmp_path, second.url, prompts))  # of the data
    assert counts == {"input": 6, "ok": 6, "error": 0, "skipped": 0}
    assert sorted(answers(tmp_path / "out", tokenizer)) == list(range(6))
    assert set(kept) <= {path.name for path in shards.glob("shard-*")} and "shard-00000" in kept
