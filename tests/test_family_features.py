"""Training's target features for every family (tests.family_targets): the hidden states the hooks capture are those
Hugging Face's own `output_hidden_states` gives (Gemma 3's scaled embeddings and +1-offset norms included), on
right-padded and on packed rows running past the sliding windows; the teacher's logits are the model's own (Gemma's
softcap included); offline training's LM head, softcap and embeddings are the online ones. Tiny fp32 targets, CPU."""
import pytest
import torch

from specdraft.config import TargetConfig
from specdraft.data.features import FINAL, hidden_key
from specdraft.methods.eagle3 import SPEC, Eagle3Config
from specdraft.targets import load_target
from specdraft.targets.features import capture_features, layers_to_store
from specdraft.targets.head_forms import logit_softcap
from specdraft.targets.heads import load_target_heads
from specdraft.train.data import collate
from specdraft.train.features import OfflineFeatures, OnlineFeatures
from tests.family_targets import FAMILY_CONFIGS, WINDOW, save_family_target

FAMILIES = list(FAMILY_CONFIGS)
LAYERS = 3
KEEP = [1, 2, LAYERS]  # inputs of layers 1 and 2, and the last layer's output after the final norm


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {family: save_family_target(root / family, family, layers=LAYERS) for family in FAMILIES}


def loaded(family_dirs, family):
    return load_target(TargetConfig(path=str(family_dirs[family])), "cpu")


def hugging_face(model, input_ids, attention_mask=None, position_ids=None):
    """Hugging Face's own forward -> (hidden_states: L + 1 of [B, T, H], logits [B, T, V])."""
    with torch.no_grad():
        out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                    output_hidden_states=True, use_cache=False)
    return out.hidden_states, out.logits


def random_rows(lengths):
    return [torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(n)) for n in lengths]


@pytest.mark.parametrize("family", FAMILIES)
def test_online_features_are_hugging_faces_hidden_states(family_dirs, family, one_thread):
    """Right-padded rows longer than the sliding window (16), as training runs them (no mask): every real token's
    captured state at each kept index, the final normed state and the teacher's logits over the whole vocabulary
    are those of Hugging Face's masked forward."""
    model = loaded(family_dirs, family).model
    rows = random_rows([40, 27])
    assert max(map(len, rows)) > WINDOW
    batch = collate([{"input_ids": r.numpy(), "loss_mask": r.numpy() * 0 + 1} for r in rows], max_length=64)
    features = OnlineFeatures(model, KEEP)(batch)
    hidden_states, logits = hugging_face(model, batch["input_ids"], batch["attention_mask"])
    real = batch["attention_mask"].bool()  # [B, T]
    assert sorted(features.hidden_states) == [0, *KEEP]
    for index, captured in features.hidden_states.items():
        torch.testing.assert_close(captured[real], hidden_states[index][real], rtol=1e-5, atol=1e-5, msg=str(index))
    torch.testing.assert_close(features.final_hidden[real], hidden_states[-1][real], rtol=1e-5, atol=1e-5)
    teacher = features.logits_for(torch.arange(model.config.vocab_size))  # [B, T, V]
    torch.testing.assert_close(teacher[real], logits[real], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_packed_rows_attend_within_their_documents(family_dirs, family, one_thread):
    """Two documents packed in one row (position ids restarting): each one's captured states and logits are those
    of Hugging Face's forward on the document alone."""
    model = loaded(family_dirs, family).model
    documents = random_rows([21, 26])
    packed = torch.cat(documents)[None]  # [1, 47]
    positions = torch.cat([torch.arange(len(d)) for d in documents])[None]  # [1, 47]
    features = capture_features(model, packed, None, KEEP, position_ids=positions)
    teacher = features.logits_for(torch.arange(model.config.vocab_size))  # [1, 47, V]
    start = 0
    for document in documents:
        span = slice(start, start + len(document))
        hidden_states, logits = hugging_face(model, document[None])
        for index in [0, *KEEP]:
            torch.testing.assert_close(features.hidden_states[index][:, span], hidden_states[index], rtol=1e-5,
                                       atol=1e-5, msg=str(index))
        torch.testing.assert_close(teacher[:, span], logits, rtol=1e-4, atol=1e-4)
        start += len(document)


@pytest.mark.parametrize("family", FAMILIES)
def test_offline_heads_embeddings_and_softcap_are_the_online_ones(family_dirs, family, one_thread):
    """What offline training keeps of the target (heads.py) gives the online teacher and embeddings: the LM head
    read from the checkpoint (tied or not), the family's softcap, and hidden_states[0] either looked up in the table
    or, where the family scales its embeddings (Gemma 3), stored with the dump."""
    target = loaded(family_dirs, family)
    model = target.model
    heads = load_target_heads(TargetConfig(path=str(family_dirs[family])), embeddings=True)
    assert torch.equal(heads.lm_head, model.get_output_embeddings().weight)
    assert heads.logit_softcap == logit_softcap(model.config) == (30.0 if family == "gemma3" else None)
    stored = layers_to_store(SPEC, Eagle3Config(feature_layers=[1, 2]), target.info, model)
    assert stored == ([0, 1, 2] if family == "gemma3" else [1, 2])  # Gemma scales its embeddings by sqrt(H)
    ids = torch.stack(random_rows([30, 30]))  # [2, 30]
    online = capture_features(model, ids, None, [1, 2])
    offline = OfflineFeatures(heads.lm_head, heads.embed_tokens, stored, target_config(family_dirs, family),
                              heads.logit_softcap)
    offline.setup(torch.device("cpu"))
    batch = {"input_ids": ids, "features": {**{hidden_key(i): online.hidden_states[i] for i in stored},
                                            FINAL: online.final_hidden}}
    features = offline(batch)
    torch.testing.assert_close(features.hidden_states[0], online.hidden_states[0], rtol=0, atol=0)
    vocab = torch.arange(model.config.vocab_size)
    torch.testing.assert_close(features.logits_for(vocab), online.logits_for(vocab), rtol=0, atol=0)


def target_config(family_dirs, family) -> TargetConfig:
    return TargetConfig(path=str(family_dirs[family]), dtype="float32")


def test_softcaps_come_from_the_families_that_have_them():
    """Gemma 2's softcap (30 by default), Gemma 3's where its config sets one (its checkpoints leave it null, as
    Gemma-3-270M's), read from a vision-language config's text part; Llama-like families have none."""
    from transformers import Gemma2Config, Gemma3Config, Gemma3TextConfig, MixtralConfig

    assert logit_softcap(Gemma2Config()) == 30.0
    assert logit_softcap(Gemma3TextConfig()) is None
    assert logit_softcap(Gemma3TextConfig(final_logit_softcapping=25.0)) == 25.0
    assert logit_softcap(Gemma3Config(text_config={"final_logit_softcapping": 20.0})) == 20.0
    assert logit_softcap(MixtralConfig()) is None


def test_gemma3_270ms_gguf_header_gives_the_layout_training_reads(tmp_path):
    """recipes/eagle3_gemma3_270m.yaml's target is a GGUF: its Gemma 3 layout comes from the fields llama.cpp writes
    (Gemma-3-270M's values here) plus Gemma3TextConfig's defaults, through transformers' GGUF reader. Training needs
    its 5 local : 1 global layers (window 512, so features keep Hugging Face's mask), the two rope bases, the query
    scale and head_dim 256, and no final-logit softcap."""
    gguf = pytest.importorskip("gguf")
    import numpy as np
    from transformers import AutoConfig
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    path = tmp_path / "gemma3.gguf"
    writer = gguf.GGUFWriter(str(path), "gemma3")
    writer.add_context_length(32768)
    writer.add_block_count(18)
    writer.add_feed_forward_length(2048)
    writer.add_embedding_length(640)
    writer.add_rope_freq_base(1e6)
    writer.add_key_length(256)
    writer.add_value_length(256)
    writer.add_head_count(4)
    writer.add_head_count_kv(1)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_sliding_window(512)
    writer.add_tensor("token_embd.weight", np.zeros((8, 640), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    fields = load_gguf_checkpoint(str(path), return_tensors=False)["config"]
    config = AutoConfig.for_model(**fields)
    assert config.model_type == "gemma3_text"
    assert config.layer_types == (["sliding_attention"] * 5 + ["full_attention"]) * 3
    assert config.sliding_window == 512
    assert {kind: rope["rope_theta"] for kind, rope in config.rope_parameters.items()} == \
        {"sliding_attention": 10_000.0, "full_attention": 1_000_000.0}
    assert (config.head_dim, config.query_pre_attn_scalar) == (256, 256)
    assert logit_softcap(config) is None
