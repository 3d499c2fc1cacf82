"""distill.engine: the static engine writes the same dataset as Hugging Face generate (float32, CPU, tiny Llama
and Qwen2 targets; multi-turn conversations, answers ending at EOS or max_new_tokens, rows refilled), resumes a
sampled run to the same draws, and is chosen, refused or fallen back from as the recipe key says."""
import logging
import shutil

import pytest
from datasets import load_from_disk

from specdraft.distill.run import run_distill
from specdraft.core.errors import SpecdraftError
from specdraft.data.format import dataset_dir, shards_dir
from specdraft.testing.tiny import byte_tokenizer, save_tiny_target, tiny_llama_config
from tests.test_distill import RECORDS, make_recipe

pytestmark = [pytest.mark.reference_kernels, pytest.mark.usefixtures("one_thread")]

MULTI_TURN = RECORDS + [{"turns": ["tell me more", "and more", "once again"]},
                        {"prompt": "a somewhat longer question that makes a longer prompt than the others"},
                        {"prompt": "z"}]


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def target_dir(request, tmp_path_factory):
    return save_tiny_target(tmp_path_factory.mktemp(request.param), layers=2, family=request.param)


def _rows(out):
    return load_from_disk(str(dataset_dir(out))).to_list()


def test_static_writes_the_dataset_hf_writes(tmp_path, target_dir):
    """max_new_tokens=40: the tiny Llama's answers end at its EOS or at the limit (the tiny Qwen2 never emits
    EOS; tests/test_batched_decoding.py ends its answers on a token it does emit)."""
    overrides = ["distill.max_new_tokens=40", "distill.batch_size=3", "distill.shard_size=5"]
    counts = run_distill(make_recipe(tmp_path, target_dir, MULTI_TURN, [*overrides, "distill.engine=hf"],
                                     out="hf"), device="cpu")
    assert run_distill(make_recipe(tmp_path, target_dir, MULTI_TURN, [*overrides, "distill.engine=static"],
                                   out="static"), device="cpu") == counts
    hf_rows, static_rows = _rows(tmp_path / "hf"), _rows(tmp_path / "static")
    assert static_rows == hf_rows and counts["ok"] == len(hf_rows) == 7
    assert max(row["turns"] for row in hf_rows) == 3
    answer_lengths = {sum(row["loss_mask"]) for row in hf_rows if row["turns"] == 1}
    assert len(answer_lengths) > 1 or target_dir.name.startswith("qwen2")


def test_static_resumes_a_sampled_run_to_the_same_draws(tmp_path, target_dir):
    recipe = make_recipe(tmp_path, target_dir, overrides=["distill.engine=static", "distill.temperature=0.9",
                                                          "distill.top_p=0.95", "distill.max_new_tokens=12"])
    run_distill(recipe, device="cpu")
    first = _rows(tmp_path / "out")
    shutil.rmtree(shards_dir(tmp_path / "out") / "shard-00001")
    run_distill(recipe, device="cpu")
    assert _rows(tmp_path / "out") == first


def test_auto_takes_hf_on_the_cpu(tmp_path, caplog):
    target = save_tiny_target(tmp_path / "target", layers=1)
    with caplog.at_level(logging.INFO, logger="specdraft.distill.engine"):
        run_distill(make_recipe(tmp_path, target, [{"prompt": "hi"}]), device="cpu")
    assert "distill.engine=auto: Hugging Face generate (the static engine pays on a GPU)" in caplog.text


def _biased_target(directory):
    """A Llama with biases on its MLP: the compact target has none."""
    from transformers import LlamaForCausalLM

    config = tiny_llama_config(layers=1)
    config.mlp_bias = True
    tokenizer = byte_tokenizer()
    config.eos_token_id, config.pad_token_id = tokenizer.eos_token_id, tokenizer.pad_token_id
    LlamaForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def test_a_target_the_static_engine_cannot_run(tmp_path, caplog):
    target = _biased_target(tmp_path / "biased")
    with pytest.raises(SpecdraftError, match=r"distill.engine=static cannot run target .*biased: biases on o_proj "
                                             r"or the MLP; use distill.engine=hf or auto"):
        run_distill(make_recipe(tmp_path, target, [{"prompt": "hi"}], ["distill.engine=static"]), device="cpu")
    from specdraft.distill.engine import static_engine
    from specdraft.targets import load_target

    recipe = make_recipe(tmp_path, target, [{"prompt": "hi"}])
    with caplog.at_level(logging.INFO, logger="specdraft.distill.engine"):
        assert static_engine(recipe, load_target(recipe.target), [0], "cuda") is None
    assert "distill.engine=auto: Hugging Face generate (biases on o_proj or the MLP)" in caplog.text


def test_an_unknown_engine_names_the_valid_ones(tmp_path):
    with pytest.raises(SpecdraftError, match="unknown distill.engine 'vllm'; valid: auto, hf, static, server"):
        make_recipe(tmp_path, tmp_path, overrides=["distill.engine=vllm"])
