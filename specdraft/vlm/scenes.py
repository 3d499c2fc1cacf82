"""Drawn scenes whose facts are known, for the small VLM's builder (specdraft/vlm/build.py): shapes (colour, kind,
size, count, position on a 3x3 grid), a rendered word (in one third of the image), or a bar chart (each bar's colour
and value); each drawn with PIL, described by a fixed template, and read back from any description so that a model's
answer can be scored fact by fact. specdraft/vlm/long.py describes the same scenes at length.

Three more kinds (DETERMINED_KINDS) are drawn to be read out item by item, so that nearly every token of the answer
is the image's (specdraft/vlm/determined.py lists and scores them): `grid`, a 4x4 grid of coloured shapes or empty
cells; `words`, six random words of WORD_LIST on three lines; `values`, a bar chart of six bars, each a colour and a
value from 1 to 9 on a ruled scale.

A description names every fact of its scene:
  shapes  The image shows two shapes on a white background: a red circle in the top left corner and a blue
          square at the bottom.
  word    The image shows the word "apple" written in green letters on a white background.
  chart   The image shows a bar chart with three bars, coloured red, blue and yellow from left to right. The
          tallest bar is the blue one.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable, Dict, List, Set, Tuple

import numpy as np
from PIL import Image, ImageDraw, ImageFont

COLOURS = {"red": (215, 35, 35), "orange": (245, 135, 20), "yellow": (230, 205, 25), "green": (35, 150, 55),
           "blue": (35, 75, 215), "purple": (135, 45, 175), "black": (25, 25, 25)}
COLOUR_NAMES = tuple(COLOURS)
SHAPES = ("circle", "square", "triangle", "diamond", "cross")
CELLS = ("in the top left corner", "at the top", "in the top right corner", "on the left", "in the middle",
         "on the right", "in the bottom left corner", "at the bottom", "in the bottom right corner")
WORDS = ("apple", "cat", "dog", "sun", "tree", "boat", "fish", "bird", "house", "moon", "star", "car", "book",
         "cake", "milk", "rain", "snow", "door", "lamp", "ship")
NUMBERS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
SIZES = ("small", "large")
ROWS = ("top", "middle", "bottom")
COLUMNS = ("left", "middle", "right")
KINDS = ("shapes", "word", "chart")
KIND_WEIGHTS = (0.7, 0.15, 0.15)
"""The described kinds, as random_scene draws them."""
DETERMINED_KINDS = ("grid", "words", "values")
"""The kinds read out item by item (determined_in_turn draws them in turn)."""
ALL_KINDS = KINDS + DETERMINED_KINDS
GRID = 4
"""A `grid` scene's rows and columns."""
GRID_EMPTY = 0.25
"""The chance that a grid cell is empty."""
WORD_LIST = ("apple", "cat", "dog", "sun", "tree", "boat", "fish", "bird", "house", "moon", "star", "car", "book",
             "cake", "milk", "rain", "snow", "door", "lamp", "ship", "hat", "cup", "pen", "box", "bus", "egg", "key",
             "map", "bed", "sock", "leaf", "rock", "ring", "bell", "drum", "frog", "goat", "kite", "nest", "rose")
"""The words a `words` scene draws from (with repeats)."""
WORD_LINES, WORDS_PER_LINE = 3, 2
VALUE_BARS = 6
READ_VALUES = tuple(range(1, 10))
"""A `values` bar's value: its height in tenths of the plot, read against the ruled lines."""
MAX_SHAPES = 4
BAR_COUNTS = (3, 4, 5)
BAR_VALUES = tuple(range(2, 10))
"""A bar's value: its height in tenths of the plot's height."""
BACKGROUND = (250, 250, 250)
PROMPTS = ("Describe this image.", "What do you see in this picture?", "Describe the image in detail.",
           "What is shown in this image?", "Tell me what this image shows.")


@dataclass(frozen=True)
class Scene:
    """One drawn image's facts; `objects` and `bars` are in reading order (left to right, top to bottom)."""
    kind: str
    objects: Tuple[Tuple[str, str, int, str], ...] = ()
    """(colour, shape, cell index 0-8, size) of each shape."""
    word: str = ""
    word_colour: str = ""
    word_row: int = 0
    """The third of the image (ROWS) the word is written in."""
    bars: Tuple[Tuple[str, int], ...] = ()
    """(colour, value in BAR_VALUES) of each bar; values are distinct (a `values` scene's: READ_VALUES, any)."""
    cells: Tuple[Tuple[str, str], ...] = ()
    """A `grid` scene's GRID * GRID cells in reading order: (colour, shape), or ("", "") for an empty one."""
    words: Tuple[str, ...] = ()
    """A `words` scene's WORD_LINES * WORDS_PER_LINE words in reading order."""
    seed: int = field(default=0, compare=False)
    """Seeds the drawing's jitter (sizes, offsets, shades), so that one scene always draws the same image."""


def random_scene(rng: random.Random) -> Scene:
    kind = rng.choices(KINDS, weights=KIND_WEIGHTS)[0]
    seed = rng.randrange(1 << 30)
    if kind == "word":
        return Scene(kind, word=rng.choice(WORDS), word_colour=rng.choice(COLOUR_NAMES), word_row=rng.randrange(3),
                     seed=seed)
    if kind == "chart":
        count = rng.choice(BAR_COUNTS)
        values = rng.sample(BAR_VALUES, count)  # distinct: the tallest bar is unambiguous
        colours = rng.sample(COLOUR_NAMES, count)
        return Scene(kind, bars=tuple(zip(colours, values)), seed=seed)
    count = rng.randint(1, MAX_SHAPES)
    cells = sorted(rng.sample(range(9), count))
    return Scene(kind, objects=tuple((rng.choice(COLOUR_NAMES), rng.choice(SHAPES), cell, rng.choice(SIZES))
                                     for cell in cells), seed=seed)


def random_determined_scene(rng: random.Random, kind: str) -> Scene:
    """A scene of `kind`, one of DETERMINED_KINDS."""
    seed = rng.randrange(1 << 30)
    if kind == "grid":
        cells = tuple(("", "") if rng.random() < GRID_EMPTY else (rng.choice(COLOUR_NAMES), rng.choice(SHAPES))
                      for _ in range(GRID * GRID))
        return Scene(kind, cells=cells, seed=seed)
    if kind == "words":
        return Scene(kind, words=tuple(rng.choice(WORD_LIST) for _ in range(WORD_LINES * WORDS_PER_LINE)), seed=seed)
    return Scene(kind, bars=tuple((rng.choice(COLOUR_NAMES), rng.choice(READ_VALUES)) for _ in range(VALUE_BARS)),
                 seed=seed)


def determined_in_turn(rng: random.Random, number: int) -> Scene:
    """The number-th determined scene of a set: DETERMINED_KINDS in turn, so that each kind has a third."""
    return random_determined_scene(rng, DETERMINED_KINDS[number % len(DETERMINED_KINDS)])


def distinct_scenes(count: int, seed: int, seen: Set[Scene],
                    draw: Callable[[random.Random, int], Scene] = determined_in_turn) -> List[Scene]:
    """`count` scenes of `draw` (a generator, the number of the scene drawn) from a generator seeded by `seed`,
    each unlike every scene of `seen` and every earlier one (redrawn until it is): held-out images that no training
    image repeats."""
    rng, scenes, taken = random.Random(seed), [], set(seen)
    while len(scenes) < count:
        scene = draw(rng, len(scenes))
        if scene not in taken:
            scenes.append(scene)
            taken.add(scene)
    return scenes


RADII = {"small": (0.26, 0.31), "large": (0.36, 0.42)}
"""A shape's radius as a share of its grid cell, per size: apart enough to tell at 64 px."""


def _shade(rng: random.Random, colour: str) -> Tuple[int, int, int]:
    return tuple(max(0, min(255, v + rng.randint(-18, 18))) for v in COLOURS[colour])


def _shape_points(shape: str, x: float, y: float, r: float) -> List[Tuple[float, float]]:
    if shape == "triangle":
        return [(x, y - r), (x + r, y + 0.8 * r), (x - r, y + 0.8 * r)]
    if shape == "diamond":
        return [(x, y - r), (x + r, y), (x, y + r), (x - r, y)]
    arm = 0.38 * r  # cross: a plus sign, 12 corners
    return [(x - arm, y - r), (x + arm, y - r), (x + arm, y - arm), (x + r, y - arm), (x + r, y + arm),
            (x + arm, y + arm), (x + arm, y + r), (x - arm, y + r), (x - arm, y + arm), (x - r, y + arm),
            (x - r, y - arm), (x - arm, y - arm)]


def _paint_shape(draw: ImageDraw.ImageDraw, shape: str, x: float, y: float, r: float, fill) -> None:
    if shape == "circle":
        draw.ellipse((x - r, y - r, x + r, y + r), fill=fill)
    elif shape == "square":
        side = 0.85 * r
        draw.rectangle((x - side, y - side, x + side, y + side), fill=fill)
    else:
        draw.polygon(_shape_points(shape, x, y, r), fill=fill)


def _draw_shapes(draw: ImageDraw.ImageDraw, scene: Scene, size: int, rng: random.Random) -> None:
    cell = size / 3
    for colour, shape, index, scale in scene.objects:
        r = cell * rng.uniform(*RADII[scale])
        x = cell * (index % 3 + 0.5) + rng.uniform(-0.08, 0.08) * cell
        y = cell * (index // 3 + 0.5) + rng.uniform(-0.08, 0.08) * cell
        _paint_shape(draw, shape, x, y, r, _shade(rng, colour))


@lru_cache(maxsize=8)
def _font(pixels: int):
    try:
        return ImageFont.load_default(size=pixels)
    except (TypeError, OSError, ImportError):  # Pillow without FreeType: its fixed bitmap font
        return ImageFont.load_default()


def _draw_word(draw: ImageDraw.ImageDraw, scene: Scene, size: int, rng: random.Random) -> None:
    font = _font(max(6, round(size * rng.uniform(0.2, 0.26))))
    left, top, right, bottom = draw.textbbox((0, 0), scene.word, font=font)
    third = size / 3  # the word's middle in its row's third, so that the row is what a reader sees
    middle = rng.uniform(third * scene.word_row, third * (scene.word_row + 1))
    x = rng.uniform(0, max(0.0, size - (right - left))) - left
    y = min(max(0.0, middle - (bottom - top) / 2), max(0.0, size - (bottom - top))) - top
    draw.text((x, y), scene.word, fill=_shade(rng, scene.word_colour), font=font)


def _draw_chart(draw: ImageDraw.ImageDraw, scene: Scene, size: int, rng: random.Random) -> None:
    margin, base = 0.08 * size, 0.9 * size
    slot = (size - 2 * margin) / len(scene.bars)
    width = slot * rng.uniform(0.6, 0.8)
    for number, (colour, value) in enumerate(scene.bars):
        x = margin + slot * number + (slot - width) / 2
        draw.rectangle((x, base - value / 10 * 0.8 * size, x + width, base), fill=_shade(rng, colour))
    draw.line((margin / 2, base, size - margin / 2, base), fill=COLOURS["black"], width=max(1, size // 64))


RULE = (200, 200, 200)
"""The light grey of a grid's lines and a values chart's scale."""


def _draw_grid(draw: ImageDraw.ImageDraw, scene: Scene, size: int, rng: random.Random) -> None:
    cell = size / GRID
    for line in range(1, GRID):
        draw.line((line * cell, 0, line * cell, size), fill=RULE)
        draw.line((0, line * cell, size, line * cell), fill=RULE)
    for index, (colour, shape) in enumerate(scene.cells):
        if colour:
            x = cell * (index % GRID + 0.5) + rng.uniform(-0.05, 0.05) * cell
            y = cell * (index // GRID + 0.5) + rng.uniform(-0.05, 0.05) * cell
            _paint_shape(draw, shape, x, y, cell * rng.uniform(0.32, 0.4), _shade(rng, colour))


def _draw_words(draw: ImageDraw.ImageDraw, scene: Scene, size: int, rng: random.Random) -> None:
    font, row, half = _font(max(6, round(size * 0.15))), size / WORD_LINES, size / WORDS_PER_LINE
    for index, word in enumerate(scene.words):
        line, column = divmod(index, WORDS_PER_LINE)
        left, top, right, bottom = draw.textbbox((0, 0), word, font=font)
        x = half * column + rng.uniform(0, max(0.0, half - (right - left) - 1)) - left
        y = row * line + max(0.0, (row - (bottom - top)) / 2) + rng.uniform(-0.1, 0.1) * row - top
        draw.text((x, y), word, fill=_shade(rng, "black"), font=font)


def _draw_values(draw: ImageDraw.ImageDraw, scene: Scene, size: int, rng: random.Random) -> None:
    margin, base, unit = 0.05 * size, 0.95 * size, 0.09 * size
    for value in READ_VALUES:  # the scale a value is read against
        draw.line((0, base - value * unit, size, base - value * unit), fill=RULE)
    slot = (size - 2 * margin) / len(scene.bars)
    width = slot * rng.uniform(0.6, 0.75)
    for number, (colour, value) in enumerate(scene.bars):
        x = margin + slot * number + (slot - width) / 2
        draw.rectangle((x, base - value * unit, x + width, base), fill=_shade(rng, colour))
    draw.line((0, base, size, base), fill=COLOURS["black"], width=max(1, size // 64))


PAINTERS = {"shapes": _draw_shapes, "word": _draw_word, "chart": _draw_chart, "grid": _draw_grid,
            "words": _draw_words, "values": _draw_values}


def draw(scene: Scene, size: int) -> Image.Image:
    """The scene as a size x size RGB image (the same image every time)."""
    rng = random.Random(scene.seed)
    image = Image.new("RGB", (size, size), tuple(v - rng.randint(0, 8) for v in BACKGROUND))
    painter = PAINTERS[scene.kind]
    painter(ImageDraw.Draw(image), scene, size, rng)
    return image


def draw_array(scene: Scene, size: int) -> np.ndarray:
    """[3, size, size] uint8 (channels first, as the vision tower reads it)."""
    return np.asarray(draw(scene, size), dtype=np.uint8).transpose(2, 0, 1).copy()


def listing(items: List[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def describe(scene: Scene) -> str:
    """The scene's true description (the template that read_description reads back)."""
    if scene.kind == "word":
        return (f'The image shows the word "{scene.word}" written in {scene.word_colour} letters '
                f"on a white background.")
    if scene.kind == "chart":
        tallest = max(scene.bars, key=lambda bar: bar[1])[0]
        return (f"The image shows a bar chart with {NUMBERS[len(scene.bars)]} bars, coloured "
                f"{listing([colour for colour, _ in scene.bars])} from left to right. "
                f"The tallest bar is the {tallest} one.")
    noun = "shape" if len(scene.objects) == 1 else "shapes"
    items = [f"{article(colour)} {colour} {shape} {CELLS[cell]}" for colour, shape, cell, _ in scene.objects]
    return f"The image shows {NUMBERS[len(scene.objects)]} {noun} on a white background: {listing(items)}."


def facts(scene: Scene) -> Dict[str, object]:
    """The facts a description is scored on (JSON-able; the prompt set records them). Sizes, bar values and the
    word's row are stated by the long description alone (specdraft/vlm/long.py). A determined scene's: its items
    in reading order (a grid's cells, None where empty; the words; each bar's colour and value)."""
    if scene.kind == "grid":
        return {"kind": "grid", "cells": [[colour, shape] if colour else None for colour, shape in scene.cells]}
    if scene.kind == "words":
        return {"kind": "words", "words": list(scene.words)}
    if scene.kind == "values":
        return {"kind": "values", "bars": [[colour, value] for colour, value in scene.bars]}
    if scene.kind == "word":
        return {"kind": "word", "word": scene.word, "word_colour": scene.word_colour, "word_row": ROWS[scene.word_row]}
    if scene.kind == "chart":
        return {"kind": "chart", "bar_count": len(scene.bars), "bar_colours": [c for c, _ in scene.bars],
                "tallest": max(scene.bars, key=lambda bar: bar[1])[0], "bar_values": [v for _, v in scene.bars]}
    return {"kind": "shapes", "count": len(scene.objects), "colours": sorted(c for c, _, _, _ in scene.objects),
            "shapes": sorted(s for _, s, _, _ in scene.objects),
            "objects": sorted([c, s, CELLS[cell]] for c, s, cell, _ in scene.objects),
            "sizes": [size for _, _, _, size in scene.objects]}


_COLOUR = "|".join(COLOUR_NAMES)
_OBJECT = re.compile(rf"\b(?:a|an) ({_COLOUR}) ({'|'.join(SHAPES)}) ({'|'.join(CELLS)})")
_COUNT = re.compile(rf"\b({'|'.join(NUMBERS)}) shapes?\b")
_WORD = re.compile(rf'the word "([^"]*)" written in ({_COLOUR}) letters')
_BARS = re.compile(rf"\b({'|'.join(NUMBERS)}) bars\b")
_BAR_COLOURS = re.compile(r"coloured (.*?) from left to right")
_TALLEST = re.compile(rf"tallest bar is the ({_COLOUR}) one")


def _number(match) -> object:
    return NUMBERS.index(match.group(1)) if match else None


def read_description(text: str) -> Dict[str, object]:
    """The facts that a description states (None for one it does not state), in facts()' form; a long description
    is read by its first paragraph, which is the short one."""
    text = text.split("\n\n")[0]
    objects = _OBJECT.findall(text)
    word, bar_colours, tallest = _WORD.search(text), _BAR_COLOURS.search(text), _TALLEST.search(text)
    return {"count": _number(_COUNT.search(text)), "colours": sorted(c for c, _, _ in objects),
            "shapes": sorted(s for _, s, _ in objects), "objects": sorted([c, s, p] for c, s, p in objects),
            "word": word.group(1) if word else None, "word_colour": word.group(2) if word else None,
            "bar_count": _number(_BARS.search(text)), "tallest": tallest.group(1) if tallest else None,
            "bar_colours": re.findall(rf"\b({_COLOUR})\b", bar_colours.group(1)) if bar_colours else None}


ATTRIBUTES = {"shapes": ("count", "colours", "shapes", "objects"), "word": ("word", "word_colour"),
              "chart": ("bar_count", "bar_colours", "tallest")}
"""The attributes scored per kind of scene; `objects` holds when every (colour, shape, position) is right."""


def score(truth: Dict[str, object], stated: Dict[str, object]) -> Dict[str, bool]:
    """attribute -> whether the description states it exactly as the scene has it."""
    return {name: stated.get(name) == truth[name] for name in ATTRIBUTES[truth["kind"]]}


AUX_SLOTS = (("kind", len(ALL_KINDS)), ("count", MAX_SHAPES),
             *((f"cell{i}_colour", 1 + len(COLOURS)) for i in range(9)),
             *((f"cell{i}_shape", 1 + len(SHAPES)) for i in range(9)),
             *((f"cell{i}_size", 1 + len(SIZES)) for i in range(9)), ("word", len(WORDS)),
             ("word_colour", len(COLOURS)), ("word_row", len(ROWS)), ("bar_count", len(BAR_COUNTS)),
             *((f"bar{i}_colour", len(COLOURS)) for i in range(max(BAR_COUNTS))),
             *((f"bar{i}_value", len(BAR_VALUES)) for i in range(max(BAR_COUNTS))), ("tallest", max(BAR_COUNTS)),
             *((f"grid{i}_colour", 1 + len(COLOURS)) for i in range(GRID * GRID)),
             *((f"grid{i}_shape", 1 + len(SHAPES)) for i in range(GRID * GRID)),
             *((f"words{i}", len(WORD_LIST)) for i in range(WORD_LINES * WORDS_PER_LINE)),
             *((f"values{i}_colour", len(COLOURS)) for i in range(VALUE_BARS)),
             *((f"values{i}_value", len(READ_VALUES)) for i in range(VALUE_BARS)))
"""Classification slots (name, classes) that pre-train the vision tower: what a description would say."""
IGNORE = -100


def aux_labels(scene: Scene) -> List[int]:
    """One class per AUX_SLOTS slot (IGNORE where the scene's kind has no such fact)."""
    labels = dict.fromkeys((name for name, _ in AUX_SLOTS), IGNORE)
    labels["kind"] = ALL_KINDS.index(scene.kind)
    if scene.kind in DETERMINED_KINDS:
        labels.update(_determined_labels(scene))
    elif scene.kind == "shapes":
        labels["count"] = len(scene.objects) - 1
        for i in range(9):
            labels[f"cell{i}_colour"] = labels[f"cell{i}_shape"] = labels[f"cell{i}_size"] = 0
        for colour, shape, cell, size in scene.objects:
            labels[f"cell{cell}_colour"] = 1 + COLOUR_NAMES.index(colour)
            labels[f"cell{cell}_shape"] = 1 + SHAPES.index(shape)
            labels[f"cell{cell}_size"] = 1 + SIZES.index(size)
    elif scene.kind == "word":
        labels["word"], labels["word_colour"] = WORDS.index(scene.word), COLOUR_NAMES.index(scene.word_colour)
        labels["word_row"] = scene.word_row
    else:
        labels["bar_count"] = BAR_COUNTS.index(len(scene.bars))
        for i, (colour, value) in enumerate(scene.bars):
            labels[f"bar{i}_colour"] = COLOUR_NAMES.index(colour)
            labels[f"bar{i}_value"] = BAR_VALUES.index(value)
        labels["tallest"] = max(range(len(scene.bars)), key=lambda i: scene.bars[i][1])
    return [labels[name] for name, _ in AUX_SLOTS]


def _determined_labels(scene: Scene) -> Dict[str, int]:
    """A determined scene's AUX_SLOTS classes: each grid cell's colour and shape (0: empty), each word, each bar's
    colour and value."""
    if scene.kind == "grid":
        return {label: value for i, (colour, shape) in enumerate(scene.cells) for label, value in
                ((f"grid{i}_colour", 1 + COLOUR_NAMES.index(colour) if colour else 0),
                 (f"grid{i}_shape", 1 + SHAPES.index(shape) if shape else 0))}
    if scene.kind == "words":
        return {f"words{i}": WORD_LIST.index(word) for i, word in enumerate(scene.words)}
    return {label: value for i, (colour, number) in enumerate(scene.bars) for label, value in
            ((f"values{i}_colour", COLOUR_NAMES.index(colour)), (f"values{i}_value", READ_VALUES.index(number)))}


def random_scenes(count: int, seed: int) -> List[Scene]:
    rng = random.Random(seed)
    return [random_scene(rng) for _ in range(count)]
