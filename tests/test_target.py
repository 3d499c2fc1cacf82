"""Target loading: sources (directory, .gguf, pkg:) and one-line errors for bad ones. CPU, tiny targets."""
import pytest

from specdraft.config import TargetConfig
from specdraft.errors import SpecdraftError
from specdraft.target import load_target, load_target_info
from tests.tiny import save_tiny_target


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
