"""specdraft.data.sources: every prompt-set format and file kind parses; bad input is a one-line SpecdraftError. CPU."""
import gzip
import json

import pytest

from specdraft.data.sources import Conversation, load_conversations
from specdraft.core.errors import SpecdraftError


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return str(path)


def only(path):
    conversations = load_conversations([path], None)
    assert len(conversations) == 1
    return conversations[0]


def roles(conversation: Conversation):
    return [message["role"] for message in conversation.messages]


def users(conversation: Conversation):
    return [message["content"] for message in conversation.messages if message["role"] == "user"]


def test_sharegpt_drops_leading_assistant_and_keeps_system(tmp_path):
    record = {"conversations": [{"from": "gpt", "value": "hello there"}, {"from": "system", "value": "sys"},
                                {"from": "human", "value": "q1"}, {"from": "gpt", "value": "a1"},
                                {"from": "human", "value": "q2"}]}
    conversation = only(write_jsonl(tmp_path / "s.jsonl", [record]))
    assert roles(conversation) == ["system", "user", "assistant", "user", "assistant"]
    assert users(conversation) == ["q1", "q2"] and conversation.messages[0]["content"] == "sys"
    assert all(m["content"] == "" for m in conversation.messages if m["role"] == "assistant")
    assert conversation.num_turns == 2 and conversation.skip_reason is None


def test_sharegpt_system_first_is_kept(tmp_path):
    record = {"conversations": [{"from": "system", "value": "be brief"}, {"from": "human", "value": "q"}]}
    conversation = only(write_jsonl(tmp_path / "s.jsonl", [record]))
    assert conversation.messages[0] == {"role": "system", "content": "be brief"}
    assert roles(conversation) == ["system", "user", "assistant"]


def test_openai_messages_and_content_parts(tmp_path):
    records = [{"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "a"},
                             {"role": "assistant", "content": "old"}, {"role": "user", "content": "b"}]},
               {"messages": [{"role": "user", "content": [{"type": "text", "text": "parts"}]}]}]
    first, second = load_conversations([write_jsonl(tmp_path / "m.jsonl", records)], None)
    assert roles(first) == ["system", "user", "assistant", "user", "assistant"]
    assert users(first) == ["a", "b"]
    assert users(second) == ["parts"]
    assert (first.index, second.index) == (0, 1)


def test_alpaca_prompt_question_and_mtbench(tmp_path):
    records = [{"instruction": "Translate", "input": "bonjour", "output": "ignored"},
               {"instruction": "Solo", "input": ""},
               {"prompt": "p"}, {"question": "why?"}, {"question_id": 81, "turns": ["t1", "t2"]}]
    conversations = load_conversations([write_jsonl(tmp_path / "mixed.jsonl", records)], None)
    assert [users(c) for c in conversations] == [["Translate\n\nbonjour"], ["Solo"], ["p"], ["why?"], ["t1", "t2"]]
    assert roles(conversations[-1]) == ["user", "assistant", "user", "assistant"]
    assert all(c.source.endswith("mixed.jsonl") for c in conversations)


def test_consecutive_user_turns_are_joined(tmp_path):
    record = {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}
    assert users(only(write_jsonl(tmp_path / "u.jsonl", [record]))) == ["a\n\nb"]


def test_json_list_and_gzip_files(tmp_path):
    (tmp_path / "l.json").write_text(json.dumps([{"prompt": "x"}, {"prompt": "y"}]))
    with gzip.open(tmp_path / "g.jsonl.gz", "wt") as handle:
        handle.write(json.dumps({"prompt": "z"}) + "\n\n")
    with gzip.open(tmp_path / "g.json.gz", "wt") as handle:
        handle.write(json.dumps([{"question": "w"}]))
    paths = [str(tmp_path / name) for name in ("l.json", "g.jsonl.gz", "g.json.gz")]
    assert [users(c)[0] for c in load_conversations(paths, None)] == ["x", "y", "z", "w"]


def test_max_samples_counts_across_sets(tmp_path):
    first = write_jsonl(tmp_path / "a.jsonl", [{"prompt": str(i)} for i in range(3)])
    second = write_jsonl(tmp_path / "b.jsonl", [{"prompt": "b"}])
    assert [users(c)[0] for c in load_conversations([first, second], 2)] == ["0", "1"]
    assert len(load_conversations([first, second], 4)) == 4


def test_no_user_turn_is_kept_as_skipped(tmp_path):
    records = [{"conversations": [{"from": "gpt", "value": "only me"}]}, {"prompt": "ok"}]
    skipped, kept = load_conversations([write_jsonl(tmp_path / "n.jsonl", records)], None)
    assert skipped.skip_reason == "no user turn" and skipped.num_turns == 0
    assert kept.skip_reason is None


def test_hf_prompt_set_goes_through_load_dataset(monkeypatch):
    import datasets

    calls = []
    monkeypatch.setattr(datasets, "load_dataset", lambda name, split: calls.append((name, split)) or [{"prompt": "h"}])
    conversations = load_conversations(["hf:org/set:test", "hf:org/other"], None)
    assert calls == [("org/set", "test"), ("org/other", "train")]
    assert conversations[0].source == "hf:org/set:test" and users(conversations[1]) == ["h"]


def test_hf_load_failure_is_one_line(monkeypatch):
    import datasets

    def fail(name, split):
        raise FileNotFoundError("Dataset 'org/none' doesn't exist\nmore")

    monkeypatch.setattr(datasets, "load_dataset", fail)
    with pytest.raises(SpecdraftError, match="hf:org/none.*doesn't exist$"):
        load_conversations(["hf:org/none"], None)


def test_missing_file_is_named(tmp_path):
    with pytest.raises(SpecdraftError, match="prompt file not found: .*nope.jsonl"):
        load_conversations([str(tmp_path / "nope.jsonl")], None)


def test_bad_jsonl_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "ok"}\n{"prompt": \n')
    with pytest.raises(SpecdraftError, match=r"bad.jsonl line 2"):
        load_conversations([str(path)], None)


def test_bad_json_names_file_and_line(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('[\n{"prompt": "a"},\n{oops}\n]')
    with pytest.raises(SpecdraftError, match=r"bad.json line 3"):
        load_conversations([str(path)], None)


def test_json_object_is_not_a_record_list(tmp_path):
    path = tmp_path / "obj.json"
    path.write_text('{"prompt": "a"}')
    with pytest.raises(SpecdraftError, match="obj.json holds a JSON dict; expected a list"):
        load_conversations([str(path)], None)


def test_unknown_record_format_lists_supported_fields(tmp_path):
    path = write_jsonl(tmp_path / "odd.jsonl", [{"prompt": "fine"}, {"text": "what"}])
    with pytest.raises(SpecdraftError, match=r"record 1 of .*odd.jsonl.*supported fields: conversations, messages"):
        load_conversations([path], None)


def test_unknown_sharegpt_speaker_lists_valid_ones(tmp_path):
    path = write_jsonl(tmp_path / "who.jsonl", [{"conversations": [{"from": "narrator", "value": "x"}]}])
    with pytest.raises(SpecdraftError, match="'narrator'.*valid: human"):
        load_conversations([path], None)


def test_empty_prompt_set(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(SpecdraftError, match="no prompts in .*empty.jsonl"):
        load_conversations([str(tmp_path / "empty.jsonl")], None)
    with pytest.raises(SpecdraftError, match="no prompt sets given"):
        load_conversations([], None)


def test_unknown_extension(tmp_path):
    (tmp_path / "p.csv").write_text("prompt\nx\n")
    with pytest.raises(SpecdraftError, match=r"p.csv.*unknown extension; valid: .jsonl"):
        load_conversations([str(tmp_path / "p.csv")], None)


def test_image_fields_resolve_against_the_prompt_file(tmp_path):
    records = [{"image": "imgs/a.png", "prompt": "<image>\nWhat?"},
               {"images": ["b.png", "/abs/c.png"], "conversations": [{"from": "human", "value": "both?"}]},
               {"prompt": "none"}]
    conversations = load_conversations([write_jsonl(tmp_path / "s.jsonl", records)], None)
    assert [c.images for c in conversations] == [[str(tmp_path / "imgs" / "a.png")],
                                                 [str(tmp_path / "b.png"), "/abs/c.png"], []]
    assert users(conversations[0]) == ["<image>\nWhat?"]
    with pytest.raises(SpecdraftError, match="record 0 of .*image/images must be a file path"):
        load_conversations([write_jsonl(tmp_path / "bad.jsonl", [{"image": 3, "prompt": "x"}])], None)
