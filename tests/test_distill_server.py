"""distill.engine=server against a fake OpenAI-compatible server (tests/fake_openai.py): the template applied here and
sent as ids or text, the answers' rows, 4xx as a prompt's error, retries with backoff on 5xx and timeouts, a server
that goes away (the run stops, keeping its shards; the rerun resumes), the API key never written, answers cut at a
length limit, bounded concurrency and the next shard asked ahead. The target is a tokenizer and a config, no
weights. CPU, offline, a few seconds."""
import json
import logging

import pytest
from datasets import load_from_disk

from specdraft.core.errors import SpecdraftError
from specdraft.data.format import dataset_dir, shards_dir
from specdraft.distill.run import run_distill
from specdraft.distill.server import request_seed
from specdraft.recipes import load_recipe
from specdraft.targets.chat import template_ids
from specdraft.testing.tiny import byte_tokenizer, tiny_llama_config
from tests.fake_openai import FakeServer, completion

TOKENIZER = byte_tokenizer()
EOS = TOKENIZER.eos_token_id


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    """A target of a tokenizer and a config.json alone: the server engine must not need weights."""
    directory = tmp_path_factory.mktemp("tokenizer_only")
    TOKENIZER.save_pretrained(directory)
    config = tiny_llama_config()
    config.eos_token_id, config.pad_token_id = EOS, TOKENIZER.pad_token_id
    config.save_pretrained(directory)
    return directory


def prompt_text(body) -> str:
    prompt = body["prompt"]
    return prompt if isinstance(prompt, str) else TOKENIZER.decode(prompt)


def answer_of(body) -> str:
    """The fake target's answer: names the prompt's last user line."""
    return "re: " + prompt_text(body).split("<|im_start|>user\n")[-1].split("<|im_end|>")[0]


def vllm_reply(body):
    text = answer_of(body)
    return 200, completion(text, TOKENIZER.encode(text) + [EOS])


def make_recipe(tmp_path, target, records, overrides=(), url="http://127.0.0.1:9", out="out"):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(record) + "\n" for record in records))
    path = tmp_path / "recipe.yaml"
    path.write_text(f"target: {{path: {target}}}\nmethod: {{name: eagle3}}\n"
                    f"data: {{prompts: [{prompts}], max_length: 256}}\n"
                    f"distill: {{output_dir: {tmp_path / out}, max_new_tokens: 8, shard_size: 2, engine: server,\n"
                    f"  server: {{url: '{url}', retries: 2, backoff: 0.02, timeout: 5}}}}\n")
    return load_recipe(path, list(overrides))


def answers_in(out) -> dict:
    """{conversation index: the masked (answer) text of its row}."""
    rows = load_from_disk(str(dataset_dir(out)))
    return {row["index"]: TOKENIZER.decode([t for t, m in zip(row["input_ids"], row["loss_mask"]) if m])
            for row in rows}


def errors_in(out) -> list:
    return [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]


PROMPTS = [{"prompt": "alpha"}, {"turns": ["beta", "gamma"]}, {"prompt": "delta"}]


def test_the_template_goes_as_ids_and_the_answers_come_back(tmp_path, tokenizer_dir):
    server = FakeServer(vllm_reply)
    counts = run_distill(make_recipe(tmp_path, tokenizer_dir, PROMPTS, [f"distill.server.url={server.url}/v1"]))
    assert counts == {"input": 3, "ok": 3, "error": 0, "skipped": 0}
    out = tmp_path / "out"
    assert answers_in(out) == {0: "re: alpha<|im_end|>\n", 1: "re: beta<|im_end|>\nre: gamma<|im_end|>\n",
                               2: "re: delta<|im_end|>\n"}
    bodies = server.completions()
    alpha = next(b for b in bodies if "alpha" in prompt_text(b))
    assert alpha["prompt"] == template_ids(TOKENIZER, [{"role": "user", "content": "alpha"}], True)  # as ids
    second_turn = next(b for b in bodies if "gamma" in prompt_text(b))
    assert prompt_text(second_turn).endswith("re: beta<|im_end|>\n<|im_start|>user\ngamma<|im_end|>\n"
                                             "<|im_start|>assistant\n")
    for body in bodies:
        assert (body["model"], body["max_tokens"], body["temperature"], body["top_p"]) == ("served", 8, 0.0, 1.0)
        assert body["return_token_ids"] and body["stop_token_ids"] == [EOS] and "seed" not in body
        assert (body["top_k"], body["min_p"], body["repetition_penalty"]) == (-1, 0.0, 1.0)
    throughput = json.loads((out / "throughput.json").read_text())
    assert throughput["server"]["answered"] == 4 and throughput["server"]["api"] == "vllm"
    assert 0 < throughput["server"]["latency_p50_s"] <= throughput["server"]["latency_p90_s"]
    assert throughput["generated_tokens"] == sum(len(TOKENIZER.encode(answer_of(b))) for b in bodies)
    assert (out / "cut.jsonl").read_text() == ""  # no answer cut


def test_a_text_server_gets_the_template_as_text_and_its_answer_is_tokenized(tmp_path, tokenizer_dir):
    server = FakeServer(lambda body: (200, completion(answer_of(body))), owned_by="me")  # llama-cpp-python
    counts = run_distill(make_recipe(tmp_path, tokenizer_dir, PROMPTS[:1], [f"distill.server.url={server.url}"]))
    assert counts["ok"] == 1 and answers_in(tmp_path / "out") == {0: "re: alpha<|im_end|>\n"}
    body = server.completions()[0]
    assert body["prompt"] == "<|im_start|>user\nalpha<|im_end|>\n<|im_start|>assistant\n"
    assert (body["repeat_penalty"], body["top_k"], body["min_p"]) == (1.0, 0, 0.0) and "return_token_ids" not in body


def test_llama_cpp_takes_ids_and_gives_the_answers_ids_as_its_probabilities(tmp_path, tokenizer_dir):
    def reply(body):  # llama-server: the ids of each generated token in logprobs.content (n_probs), its EOS too
        text = answer_of(body)
        content = [{"id": i, "token": TOKENIZER.decode([i]), "logprob": -0.1} for i in TOKENIZER.encode(text) + [EOS]]
        return 200, {"choices": [{"text": "ignored", "index": 0, "finish_reason": "stop",
                                  "logprobs": {"content": content}}]}

    server = FakeServer(reply, owned_by="llamacpp")
    counts = run_distill(make_recipe(tmp_path, tokenizer_dir, PROMPTS[:1], [f"distill.server.url={server.url}"]))
    assert counts["ok"] == 1 and answers_in(tmp_path / "out") == {0: "re: alpha<|im_end|>\n"}
    body = server.completions()[0]
    assert isinstance(body["prompt"], list) and (body["n_probs"], body["repeat_penalty"], body["top_k"]) == (1, 1.0, 0)


def test_an_unknown_server_gets_openais_fields_only(tmp_path, tokenizer_dir):
    server = FakeServer(lambda body: (200, completion(answer_of(body))), owned_by="openai")
    assert run_distill(make_recipe(tmp_path, tokenizer_dir, PROMPTS[:1], [f"distill.server.url={server.url}"]))["ok"]
    assert set(server.completions()[0]) == {"model", "prompt", "max_tokens", "temperature", "top_p",
                                            "presence_penalty", "frequency_penalty"}


def test_sampling_settings_and_a_seed_per_prompt(tmp_path, tokenizer_dir):
    server = FakeServer(vllm_reply)
    run_distill(make_recipe(tmp_path, tokenizer_dir, PROMPTS[:1] + PROMPTS[2:], [
        f"distill.server.url={server.url}", "distill.temperature=0.7", "distill.top_p=0.9", "distill.seed=5"]))
    first, second = server.completions()
    assert (first["temperature"], first["top_p"]) == (0.7, 0.9)
    assert first["seed"] == request_seed(5, first["prompt"]) != second["seed"]


def test_a_4xx_is_that_prompts_error_and_is_not_retried(tmp_path, tokenizer_dir):
    def reply(body):
        if "bad" in prompt_text(body):
            return 400, {"error": {"message": "This model's maximum context length is 64 tokens",
                                   "type": "invalid_request_error"}}
        return vllm_reply(body)

    server = FakeServer(reply)
    records = [{"prompt": "good"}, {"prompt": "bad one"}, {"prompt": "fine"}]
    counts = run_distill(make_recipe(tmp_path, tokenizer_dir, records, [f"distill.server.url={server.url}"]))
    assert counts == {"input": 3, "ok": 2, "error": 1, "skipped": 0}
    assert errors_in(tmp_path / "out") == [{"source": str(tmp_path / "prompts.jsonl"), "index": 1, "status": "error",
                                            "reason": "server answered 400: This model's maximum context length "
                                                      "is 64 tokens"}]
    assert sum("bad" in prompt_text(b) for b in server.completions()) == 1


def test_5xx_and_timeouts_are_retried_with_backoff(tmp_path, tokenizer_dir):
    attempts = {}

    def reply(body):
        key = prompt_text(body)
        attempts[key] = attempts.get(key, 0) + 1
        if body["max_tokens"] == 1:
            return vllm_reply(body)
        if attempts[key] == 1:
            return 503, {"error": {"message": "overloaded"}}
        if attempts[key] == 2:
            return (*vllm_reply(body), 1.0)  # beyond the request timeout
        return vllm_reply(body)

    server = FakeServer(reply)
    recipe = make_recipe(tmp_path, tokenizer_dir, [{"prompt": "slow"}], [
        f"distill.server.url={server.url}", "distill.server.timeout=0.3", "distill.server.backoff=0.1"])
    assert run_distill(recipe)["ok"] == 1
    times = [r["time"] for r in server.requests if r["body"] and r["body"]["max_tokens"] != 1]
    assert len(times) == 3
    assert times[1] - times[0] >= 0.1 and times[2] - times[1] >= 0.3 + 0.2  # the timeout, then twice the backoff
    assert json.loads((tmp_path / "out" / "throughput.json").read_text())["server"]["retries"] == 2


def test_a_prompt_failing_every_retry_is_its_error_while_the_server_answers(tmp_path, tokenizer_dir):
    def reply(body):
        if "cursed" in prompt_text(body):
            return 500, {"error": {"message": "internal error on this prompt"}}
        return vllm_reply(body)

    server = FakeServer(reply)
    records = [{"prompt": "cursed"}, {"prompt": "fine"}]
    counts = run_distill(make_recipe(tmp_path, tokenizer_dir, records, [f"distill.server.url={server.url}"]))
    assert counts == {"input": 2, "ok": 1, "error": 1, "skipped": 0}
    assert errors_in(tmp_path / "out")[0]["reason"] == ("server failed 3 attempts: 500: internal error on this "
                                                        "prompt")


def test_prompts_in_a_row_out_of_retries_stop_the_run(tmp_path, tokenizer_dir):
    server = FakeServer(lambda body: vllm_reply(body) if body["max_tokens"] == 1 else (502, {"error": "bad gateway"}))
    records = [{"prompt": f"p{i}"} for i in range(4)]
    with pytest.raises(SpecdraftError, match=r"3 prompts in a row failed \(502: bad gateway after 3 attempts\); "
                                             r"distill-data stopped with 0 of its 1 shards written"):
        run_distill(make_recipe(tmp_path, tokenizer_dir, records, [
            f"distill.server.url={server.url}", "distill.server.concurrency=1", "distill.shard_size=4"]))
    assert not list(shards_dir(tmp_path / "out").glob("shard-*"))


def test_a_server_that_goes_away_loses_nothing_written_and_the_rerun_resumes(tmp_path, tokenizer_dir):
    answered = []

    def reply(body):
        if body["max_tokens"] != 1 and len(answered) < 4:
            answered.append(prompt_text(body))
            if len(answered) == 4:  # mid-way through the second shard: it dies before answering
                server.kill()
        return vllm_reply(body)

    server = FakeServer(reply)
    records = [{"prompt": f"question {i}"} for i in range(6)]
    recipe = make_recipe(tmp_path, tokenizer_dir, records, [f"distill.server.url={server.url}",
                                                            "distill.server.concurrency=1"])
    with pytest.raises(SpecdraftError) as raised:
        run_distill(recipe)
    message = str(raised.value)
    assert "\n" not in message and f"the server at {server.url} failed: it stopped answering" in message
    assert "distill-data stopped with 1 of its 3 shards written" in message
    out = tmp_path / "out"
    assert [p.name for p in shards_dir(out).glob("shard-*")] == ["shard-00000"]
    server.start()  # back on the same port
    before = len(server.completions())
    assert run_distill(recipe) == {"input": 6, "ok": 6, "error": 0, "skipped": 0}
    assert sorted(answers_in(out)) == list(range(6))  # each prompt once
    asked_again = [prompt_text(b) for b in server.completions()[before:]]
    assert not any("question 0" in text or "question 1" in text for text in asked_again)  # shard 0 was kept


def test_no_server_is_one_line_before_anything_is_written(tmp_path, tokenizer_dir):
    server = FakeServer(vllm_reply)
    server.kill()
    recipe = make_recipe(tmp_path, tokenizer_dir, PROMPTS, [f"distill.server.url={server.url}",
                                                            "distill.server.retries=1"])
    with pytest.raises(SpecdraftError, match=rf"no server answers at {server.url} \(connection refused after 2 "
                                             rf"attempts\); start it first"):
        run_distill(recipe)
    assert not (tmp_path / "out").exists()


def test_the_served_model_is_checked(tmp_path, tokenizer_dir):
    server = FakeServer(vllm_reply, models=("a", "b"))
    with pytest.raises(SpecdraftError, match=r"set distill.server.model: .* \(it serves a, b\)"):
        run_distill(make_recipe(tmp_path, tokenizer_dir, PROMPTS, [f"distill.server.url={server.url}"]))
    with pytest.raises(SpecdraftError, match=r"distill.server.model='c' is not served at .*; it serves: a, b"):
        run_distill(make_recipe(tmp_path, tokenizer_dir, PROMPTS, [f"distill.server.url={server.url}",
                                                                   "distill.server.model=c"]))
    assert run_distill(make_recipe(tmp_path, tokenizer_dir, PROMPTS, [f"distill.server.url={server.url}",
                                                                      "distill.server.model=b"]))["ok"] == 3


def test_the_api_key_is_sent_and_never_written(tmp_path, tokenizer_dir, monkeypatch, capsys, caplog):
    key = "sk-test-5f3a9c0e7d"
    monkeypatch.setenv("TEST_SERVER_KEY", key)
    server = FakeServer(vllm_reply, key=key)
    caplog.set_level(logging.DEBUG)
    recipe = make_recipe(tmp_path, tokenizer_dir, PROMPTS, [f"distill.server.url={server.url}",
                                                            "distill.server.api_key_env=TEST_SERVER_KEY"])
    assert run_distill(recipe)["ok"] == 3
    assert all(r["headers"]["Authorization"] == f"Bearer {key}" for r in server.requests)
    monkeypatch.setenv("TEST_SERVER_KEY", key + "-wrong")  # the server echoes the wrong key it got
    with pytest.raises(SpecdraftError) as refused:
        run_distill(make_recipe(tmp_path, tokenizer_dir, PROMPTS, [
            f"distill.server.url={server.url}", "distill.server.api_key_env=TEST_SERVER_KEY"], out="out2"))
    assert "refused the API key in $TEST_SERVER_KEY (401: bad key Bearer ***)" in str(refused.value)
    written = b"".join(path.read_bytes() for path in tmp_path.rglob("*") if path.is_file())
    seen = capsys.readouterr()
    assert key.encode() not in written and key not in seen.out + seen.err + caplog.text + str(refused.value)
    monkeypatch.delenv("TEST_SERVER_KEY")
    with pytest.raises(SpecdraftError, match=r"distill.server.api_key_env names \$TEST_SERVER_KEY, which is not set"):
        run_distill(make_recipe(tmp_path, tokenizer_dir, PROMPTS, [
            f"distill.server.url={server.url}", "distill.server.api_key_env=TEST_SERVER_KEY"], out="out3"))


def test_answers_cut_at_a_length_limit_are_marked(tmp_path, tokenizer_dir, capsys):
    def reply(body):
        text = answer_of(body)
        if "long" in text:
            return 200, completion(text[:3], TOKENIZER.encode(text[:3]), finish="length")  # the server's context
        if "max" in text:
            return 200, completion("x" * 8, TOKENIZER.encode("x" * 8), finish="length")  # max_tokens
        return vllm_reply(body)

    server = FakeServer(reply)
    records = [{"prompt": "long"}, {"prompt": "max"}, {"prompt": "short"}]
    counts = run_distill(make_recipe(tmp_path, tokenizer_dir, records, [f"distill.server.url={server.url}"]))
    assert counts["ok"] == 3
    cut = [json.loads(line) for line in (tmp_path / "out" / "cut.jsonl").read_text().splitlines()]
    assert [(c["index"], c["turn"], c["tokens"], c["reason"]) for c in cut] == [
        (0, 0, 3, "cut by the server's length limit after 3 tokens (its context is full)"),
        (1, 0, 8, "cut at distill.max_new_tokens=8")]
    assert "(2 answers cut at a length limit:" in capsys.readouterr().err


def test_concurrency_is_bounded_and_the_next_shard_is_asked_ahead(tmp_path, tokenizer_dir):
    server = FakeServer(lambda body: (*vllm_reply(body), 0.1))
    records = [{"prompt": f"q{i}"} for i in range(8)]
    counts = run_distill(make_recipe(tmp_path, tokenizer_dir, records, [f"distill.server.url={server.url}",
                                                                        "distill.server.concurrency=3"]))
    assert counts["ok"] == 8
    assert server.most_in_flight == 3  # shards hold 2 prompts: the third in flight is the next shard's


def test_server_settings_are_checked(tmp_path, tokenizer_dir):
    with pytest.raises(SpecdraftError, match=r"distill.engine=server needs distill.server.url"):
        make_recipe(tmp_path, tokenizer_dir, PROMPTS, ["distill.server.url=null"])
    with pytest.raises(SpecdraftError, match=r"unknown distill.server.api 'tgi'; valid: auto, vllm, sglang, "
                                             r"llamacpp, llama-cpp-python, openai"):
        make_recipe(tmp_path, tokenizer_dir, PROMPTS, ["distill.server.api=tgi"])
    with pytest.raises(SpecdraftError, match=r"valid keys in 'distill.server': url, model, api_key_env"):
        make_recipe(tmp_path, tokenizer_dir, PROMPTS, ["distill.server.port=1"])


def test_the_slurm_template_starts_a_server_beside_each_worker(tmp_path, tokenizer_dir):
    import subprocess

    from specdraft.launch.slurm import TEMPLATES, SlurmJob, render

    make_recipe(tmp_path, tokenizer_dir, PROMPTS)
    text, _ = render(SlurmJob(kind="distill-data", recipe=str(tmp_path / "recipe.yaml"), nodes=3,
                              template=str(TEMPLATES / "distill-data-server.sbatch")))
    assert "#SBATCH --array=0-2" in text and "setsid $SERVER_CMD" in text
    assert not any(f"${{{name}}}" in text for name in ("job_name", "array", "log", "workdir", "command", "directives"))
    assert text.rstrip().endswith("distill.engine=server distill.server.url=http://127.0.0.1:$SERVER_PORT")
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0
