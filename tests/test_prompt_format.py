"""target.prompt_format: a base model's plain prompt form (no chat template), used wherever prompts are encoded
(distill-data's prompts and loss masks, eval, the runtime's generate, C2T traces, judge mining). The tiny target here
has no chat template at all, so a stage that ignored the plain form would fail. CPU, tiny targets."""
import json
from types import SimpleNamespace

import pytest

from specdraft import cli
from specdraft.config import TargetConfig
from specdraft.core.errors import SpecdraftError
from specdraft.targets import load_target
from specdraft.targets.chat import PlainChat
from specdraft.testing.tiny import byte_tokenizer, save_tiny_target

FORM = "Q: {prompt}\nA:"


@pytest.fixture(scope="module")
def base_target_dir(tmp_path_factory):
    """A tiny random Llama whose tokenizer has no chat template (a base model)."""
    return save_tiny_target(tmp_path_factory.mktemp("base_target"), chat_template=None)


def text_ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("value", ["{question}", "plain", "{prompt} and {prompt}", "{prompt", ""])
def test_a_bad_prompt_format_is_one_line(value):
    with pytest.raises(SpecdraftError, match=r"^target\.prompt_format must be chat \(the target's chat template\) or a "
                                             r"format string holding \{prompt\} once, such as '\{prompt\}\\n'"):
        TargetConfig(prompt_format=value)


def test_a_target_without_template_or_plain_form_says_which_key_to_set(base_target_dir):
    with pytest.raises(SpecdraftError) as err:
        load_target(TargetConfig(path=str(base_target_dir)))
    assert "has no chat template; for a base model set target.prompt_format to a plain form" in str(err.value)
    assert "\n" not in str(err.value)


def test_the_plain_form_encodes_each_turn_apart_and_prefixes_stay_prefixes(base_target_dir):
    target = load_target(TargetConfig(path=str(base_target_dir), prompt_format=FORM))
    chat, tokenizer = target.chat, target.tokenizer
    assert isinstance(chat, PlainChat) and chat.forms_prompts
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "two?"},
                {"role": "assistant", "content": "2"}, {"role": "user", "content": "three?"}]
    first = chat.ids(messages[:2], add_generation_prompt=True)
    assert first == text_ids(tokenizer, "be brief\n") + text_ids(tokenizer, "Q: two?\nA:")
    whole = chat.ids(messages, add_generation_prompt=True)
    assert whole[:len(first)] == first
    assert whole[len(first):] == text_ids(tokenizer, "2") + [tokenizer.eos_token_id] + \
        text_ids(tokenizer, "Q: three?\nA:")
    with pytest.raises(ValueError, match="no place for a 'tool' turn"):
        chat.ids([{"role": "tool", "content": "x"}])
    with pytest.raises(SpecdraftError, match="this target reads none"):
        chat.ids(messages[:2], images=[object()])


def test_a_tokenizer_that_adds_a_bos_starts_with_it():
    from tokenizers.processors import TemplateProcessing

    tokenizer = byte_tokenizer(chat_template=None)
    tokenizer.add_special_tokens({"bos_token": "<s>"})
    bos = tokenizer.bos_token_id
    tokenizer.backend_tokenizer.post_processor = TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    assert tokenizer("x")["input_ids"][0] == bos
    chat = PlainChat(tokenizer, "{prompt}\n")
    assert chat.ids([{"role": "user", "content": "hi"}]) == [bos] + text_ids(tokenizer, "hi\n")
    assert PlainChat(byte_tokenizer(chat_template=None), "{prompt}").start_ids == []


def test_runtime_c2t_and_judge_prompts_take_the_plain_form(base_target_dir):
    from specdraft.methods.c2t.traces import _prompt_ids
    from specdraft.methods.judge.mining import JudgeMiner
    from specdraft.runtime.load import Runtime

    target = load_target(TargetConfig(path=str(base_target_dir), prompt_format=FORM))
    expected = text_ids(target.tokenizer, "Q: six?\nA:")
    assert Runtime.encode_chat(SimpleNamespace(target=target), "six?") == expected
    conversation = SimpleNamespace(messages=[{"role": "user", "content": "six?"}])
    assert _prompt_ids(target.chat, conversation) == expected
    assert JudgeMiner.prompt_ids(SimpleNamespace(target=target), conversation) == expected


def test_distill_train_export_eval_and_generate_on_a_base_target(tmp_path, base_target_dir, capsys):
    """Every stage of a recipe with a plain form runs on a target without a chat template; distill-data's rows hold
    the plain-form prompt, and the answer (with its EOS) is the masked span."""
    from datasets import load_from_disk

    from specdraft.data.format import dataset_dir

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"turns": [f"question {i}?"]}) + "\n" for i in range(8)))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"""
target: {{path: {base_target_dir}, prompt_format: "Q: {{prompt}}\\nA:"}}
method: {{name: eagle3, ttt_steps: 2, draft_vocab_size: 256}}
data: {{prompts: [{prompts}], max_length: 128, val_fraction: 0.25}}
distill: {{output_dir: {tmp_path / "data"}, max_new_tokens: 8, batch_size: 4, shard_size: 4}}
train: {{output_dir: {tmp_path / "run"}, max_steps: 2, micro_batch_size: 2, val_every_steps: 2, warmup_steps: 1,
        log_every_steps: 1}}
eval: {{prompts: {prompts}, max_prompts: 2, max_new_tokens: 8, depth: 2}}
""")
    assert cli.main(["distill-data", str(recipe)]) == 0
    tokenizer = byte_tokenizer(chat_template=None)
    rows = load_from_disk(str(dataset_dir(tmp_path / "data")))
    assert len(rows) == 8
    for row in rows:
        prompt = text_ids(tokenizer, f"Q: question {row['index']}?\nA:")
        assert row["input_ids"][:len(prompt)] == prompt
        assert row["loss_mask"] == [0] * len(prompt) + [1] * (len(row["input_ids"]) - len(prompt))
    assert cli.main(["train", str(recipe)]) == 0
    assert cli.main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "hf")]) == 0
    assert cli.main(["eval", str(tmp_path / "hf"), "--out", str(tmp_path / "ev")]) == 0
    assert json.loads((tmp_path / "ev" / "eval.json").read_text())["lossless"] is True
    capsys.readouterr()
    assert cli.main(["generate", str(tmp_path / "hf"), "--prompt", "question 1?", "--max-new-tokens", "6",
                     "--device", "cpu", "--max-len", "128"]) == 0
