"""Target loading: sources (directory, .gguf, pkg:) and one-line errors for bad ones. CPU, tiny targets."""
import pytest
import torch

from specdraft.config import TargetConfig
from specdraft.core.errors import SpecdraftError
from specdraft.targets import load_target, load_target_info
from specdraft.testing.tiny import save_tiny_target


def test_directory_target_geometry_comes_from_its_config(tiny_target_dir):
    info = load_target_info(TargetConfig(path=str(tiny_target_dir)))
    assert (info.hidden_size, info.num_layers, info.vocab_size, info.num_kv_heads) == (64, 4, 320, 2)


@pytest.mark.parametrize("path, message", [
    ("./no/such/dir", "target directory not found: ./no/such/dir"),
    ("/tmp/none.gguf", "target GGUF file not found: /tmp/none.gguf"),
    ("pkg:no_such_package_xyz/model.gguf", "package 'no_such_package_xyz'"),
])
def test_missing_targets_name_the_path(path, message):
    with pytest.raises(SpecdraftError, match=message.replace(".", r"\.")):
        load_target(TargetConfig(path=path))


def test_corrupt_gguf_is_a_clean_error(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 64)
    with pytest.raises(SpecdraftError, match="cannot read GGUF target .*broken.gguf"):
        load_target(TargetConfig(path=str(bad)))


def test_target_without_chat_template_is_refused(tmp_path):
    directory = save_tiny_target(tmp_path / "plain", chat_template=None)
    with pytest.raises(SpecdraftError, match="has no chat template"):
        load_target(TargetConfig(path=str(directory)))


def test_random_init_needs_only_config_and_tokenizer(tmp_path):
    from specdraft.testing.tiny import byte_tokenizer, tiny_llama_config

    tiny_llama_config(layers=3).save_pretrained(tmp_path)
    byte_tokenizer().save_pretrained(tmp_path)
    with pytest.raises(SpecdraftError, match="cannot load target"):
        load_target(TargetConfig(path=str(tmp_path)))
    loaded = load_target(TargetConfig(path=str(tmp_path), random_init=True, dtype="bfloat16"))
    layer = loaded.model.model.layers[0]
    assert loaded.info.num_layers == 3 and layer.mlp.up_proj.weight.dtype == torch.bfloat16
    assert float(layer.mlp.up_proj.weight.float().std()) == pytest.approx(0.02, rel=0.1)
    assert bool((loaded.model.model.norm.weight == 1).all())
    assert all(torch.isfinite(p.float()).all() for p in loaded.model.parameters())


def test_a_gguf_head_left_on_meta_is_tied_to_the_embedding(tmp_path):
    """llama.cpp's convention (no output.weight: tied). If loading leaves the head on the meta device, the
    conversion ties it before saving, and the saved target's head is the embedding."""
    from transformers import LlamaForCausalLM

    from specdraft.targets.load import tie_meta_head
    from specdraft.testing.tiny import tiny_llama_config

    config = tiny_llama_config()
    config.tie_word_embeddings = False
    model = LlamaForCausalLM(config)
    model.lm_head.weight = torch.nn.Parameter(torch.empty_like(model.lm_head.weight, device="meta"))
    tie_meta_head(model, "smol.gguf", tied=True)
    model.save_pretrained(tmp_path)
    saved = LlamaForCausalLM.from_pretrained(tmp_path)
    assert saved.config.tie_word_embeddings
    assert torch.equal(saved.lm_head.weight, model.model.embed_tokens.weight)


@pytest.mark.parametrize("tied", [True, False])
def test_loading_ties_a_meta_head_only_when_the_config_says_tied(tmp_path, monkeypatch, tied):
    """load_target: a tied head left on the meta device (seen in full test sessions) is tied again; an untied
    one is a clear error naming the weight, not a failure inside Module.to()."""
    import json

    from transformers import AutoModelForCausalLM

    directory = save_tiny_target(tmp_path / "target")
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": tied}))
    real = AutoModelForCausalLM.from_pretrained

    def head_on_meta(*args, **kwargs):
        model = real(*args, **kwargs)
        model.lm_head.weight = torch.nn.Parameter(torch.empty_like(model.lm_head.weight, device="meta"))
        return model

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", head_on_meta)
    if tied:
        model = load_target(TargetConfig(path=str(directory))).model
        assert model.lm_head.weight is model.model.embed_tokens.weight
    else:
        with pytest.raises(SpecdraftError, match="no data for lm_head.weight"):
            load_target(TargetConfig(path=str(directory)))


def test_models_are_built_one_at_a_time(tiny_target_dir, monkeypatch):
    """Transformers swaps PreTrainedModel.tie_weights class-wide while it builds a model: two loads at once in
    threads (distill-data workers, in tests) once left it a no-op for the rest of the process, and every later
    tied model kept its LM head on the meta device. Loads overlap nowhere, and tie_weights is left as it was."""
    import threading
    import time

    from transformers import AutoModelForCausalLM, PreTrainedModel

    real, tie_weights = AutoModelForCausalLM.from_pretrained, PreTrainedModel.tie_weights
    inside, most = [0], [0]

    def slow_load(*args, **kwargs):
        inside[0] += 1
        most[0] = max(most[0], inside[0])
        time.sleep(0.2)  # without the lock the other thread enters meanwhile
        try:
            return real(*args, **kwargs)
        finally:
            inside[0] -= 1

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", slow_load)
    threads = [threading.Thread(target=load_target, args=(TargetConfig(path=str(tiny_target_dir)),))
               for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert most[0] == 1
    assert PreTrainedModel.tie_weights is tie_weights
