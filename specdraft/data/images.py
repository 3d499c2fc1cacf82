"""The image files of image prompt sets, stored with the distilled data.

Each image a conversation uses is copied once into DISTILL_DIR/images/, named by the SHA-256 of its bytes
(`images/<64 hex digits><suffix>`): a dataset moves as one folder, and the same image under two names (or in two
distilled sets) is one file. Rows name their images by that relative name (the `images` column of
specdraft.data.format); training finds a name in whichever distilled folder it reads holds it (`resolve_image`).
An image that is missing or does not decode raises `UnreadableImage`, whose message names the file: the data stage
counts it as its conversation's error.
"""
from __future__ import annotations

import hashlib
import io
import os
import uuid
from pathlib import Path
from typing import Sequence

from specdraft.core.errors import SpecdraftError
from specdraft.core.io import TMP_PREFIX

IMAGES_DIR = "images"


class UnreadableImage(Exception):
    """An image file that is missing or does not decode; the message names it."""


def _read_bytes(path: str | Path) -> bytes:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise UnreadableImage(f"image not found: {path}") from None
    except OSError as err:
        raise UnreadableImage(f"cannot read image {path}: {err.strerror or err}") from None


def _decoded(data: bytes, path: str | Path):
    """The bytes of image file `path` decoded into an RGB PIL image."""
    from PIL import Image, UnidentifiedImageError

    try:
        image = Image.open(io.BytesIO(data))
        image.load()
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as err:
        raise UnreadableImage(f"unreadable image {path}: {type(err).__name__}: "
                              f"{(str(err).splitlines() or [''])[0]}") from None
    return image.convert("RGB")


def load_image(path: str | Path):
    """An image file as an RGB PIL image; UnreadableImage (naming the file) when it is missing or corrupt."""
    return _decoded(_read_bytes(path), path)


def load_images(paths: Sequence[str | Path]) -> list:
    """Image files as RGB PIL images, where a bad one stops the command: a SpecdraftError naming it."""
    try:
        return [load_image(path) for path in paths]
    except UnreadableImage as err:
        raise SpecdraftError(str(err)) from None


def store_image(path: str | Path, distill_dir: str | Path) -> str:
    """Copy an image file (checked to decode) into DISTILL_DIR/images/ under its content hash, unless it is there
    already -> its name relative to DISTILL_DIR. The copy appears in one rename (concurrent workers may store the
    same image: the last rename wins, with the same bytes)."""
    data = _read_bytes(path)
    _decoded(data, path)
    name = f"{IMAGES_DIR}/{hashlib.sha256(data).hexdigest()}{Path(path).suffix.lower()}"
    final = Path(distill_dir) / name
    if not final.is_file():
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_name(f"{TMP_PREFIX}{final.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        tmp.write_bytes(data)
        os.replace(tmp, final)
    return name


def resolve_image(name: str, distill_dirs: Sequence[str | Path]) -> Path:
    """A row's image name -> the file in the first of the distilled folders that holds it."""
    for distill_dir in distill_dirs:
        path = Path(distill_dir) / name
        if path.is_file():
            return path
    raise SpecdraftError(f"image {name} of the distilled data is in none of {', '.join(map(str, distill_dirs))}; "
                         f"a distilled folder moves whole, its {IMAGES_DIR}/ included")
