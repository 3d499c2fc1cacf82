"""Shared fixtures. Everything runs on CPU, offline; tiny targets are built in tmp dirs, never downloaded."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

if not torch.cuda.is_available():  # Triton kernels are tested on the CPU through its interpreter, where a test
    os.environ.setdefault("TRITON_INTERPRET", "1")  # asks for them (`_kernels_on_cpu`); elsewhere the references
    os.environ.setdefault("SPECDRAFT_KERNELS", "reference")  # run, in fixtures of any scope and subprocesses too

import pytest  # noqa: E402

from specdraft.testing.tiny import save_tiny_target  # noqa: E402
from tests.distilled import train_chat_base, write_distilled, write_distilled_images  # noqa: E402
from tests.tiny_vlm import save_tiny_vlm  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _kernels_on_cpu(request, monkeypatch):
    """On a CPU the Triton kernels run through Triton's interpreter, far too slowly for whole trainings and
    generations: the process runs the kernels' PyTorch references (SPECDRAFT_KERNELS=reference, set above for
    every fixture and subprocess) except in tests/kernels, which compares each kernel with its reference, and the
    tests marked `triton_kernels`, which decode through them. A module marked `reference_kernels` runs the
    references on any device: its tests are about what the kernels feed (tests/kernels checks the kernels)."""
    if "reference_kernels" in request.keywords:
        monkeypatch.setenv("SPECDRAFT_KERNELS", "reference")
        return
    if torch.cuda.is_available() or not ("triton_kernels" in request.keywords
                                         or request.node.path.parent.name == "kernels"):
        return
    monkeypatch.delenv("SPECDRAFT_KERNELS", raising=False)


@pytest.fixture(scope="session")
def tiny_target_dir(tmp_path_factory):
    """A tiny random Llama target with a byte tokenizer and a ChatML template (HF directory)."""
    return save_tiny_target(tmp_path_factory.mktemp("tiny_target"))


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("SPECDRAFT_CACHE", os.environ.get("SPECDRAFT_CACHE") or
                       str(tmp_path_factory.getbasetemp() / "specdraft-cache"))


@pytest.fixture(autouse=True)
def _checkpoint_key(tmp_path_factory, monkeypatch):
    """DeepSpeed checkpoints are signed with a key of the test session's own, never the user's."""
    monkeypatch.setenv("SPECDRAFT_CHECKPOINT_KEY", str(tmp_path_factory.getbasetemp() / "checkpoint.key"))


@pytest.fixture(scope="session")
def distilled(tiny_target_dir, tmp_path_factory):
    """A distilled dataset (12 rows) of the tiny target's own greedy answers."""
    return write_distilled(tmp_path_factory.mktemp("distilled"), tiny_target_dir)


@pytest.fixture(scope="session")
def tiny_vlm_dir(tmp_path_factory):
    """A tiny random LLaVA (SigLIP-style tower, Llama language model) with its processor (HF directory)."""
    return save_tiny_vlm(tmp_path_factory.mktemp("tiny_vlm"), "llava")


@pytest.fixture(scope="session")
def distilled_images(tiny_vlm_dir, tmp_path_factory):
    """A distilled dataset (12 rows) of the tiny VLM's own greedy answers to image prompts, images stored."""
    return write_distilled_images(tmp_path_factory.mktemp("distilled_images"), tiny_vlm_dir)


@pytest.fixture(scope="session")
def chat_base_export(tiny_target_dir, tmp_path_factory):
    """An EAGLE-3 export of the tiny target, trained on its answers to tests.distilled.CHAT_PROMPTS: the draft an
    add-on method (C2T) extends, accepted on those prompts."""
    return train_chat_base(tmp_path_factory.mktemp("chat_base"), tiny_target_dir)


@pytest.fixture
def one_thread():
    """torch on one thread for the test: small CPU ops ran 10x slower on two threads of a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
