"""Long descriptions of specdraft/vlm/scenes.py's drawn scenes: what the small VLM that `specdraft build-small-vlm`
builds answers when its prompt ends with the long-answer instruction (INSTRUCTION: ViSpec's "answer at length", the
text recipes/vispec_*.yaml's distill.answer_instruction appends to a user turn on a line of its own).

A long description opens with the short one (its first paragraph, which scenes.read_description reads), then goes
over the same scene again in other orders and groupings, a paragraph each, adding facts the short one leaves
out (each shape's size, each bar's value, the word's row). Nearly every word that is not a fixed label depends on
the image (a colour, a kind, a size, a count, a position, a letter), so that a draft that sees the image has
something to gain over one that reads the text alone (`blind_share` measures it).

  shapes  the short description; shape by shape (size, colour, kind, row, column); row by row; column by column;
          each shape against each later one; counts by colour, kind and size; the empty cells; a summary
  chart   the short description; bar by bar (colour, value); tallest to shortest; each bar against the one before
          it and the shortest; the colours left out; a summary
  word    the short description; the word's row; its letters, forwards and backwards; a summary
"""
from __future__ import annotations

import difflib
import re
from typing import Dict, List, Sequence

from specdraft.vlm.scenes import (CELLS, COLOUR_NAMES, COLUMNS, NUMBERS, ROWS, SHAPES, SIZES, Scene, article, describe,
                                  listing, read_description, score)

INSTRUCTION = "Please answer with at least 1000 words."
ORDINALS = ("first", "second", "third", "fourth", "fifth")
PLURALS = {"circle": "circles", "square": "squares", "triangle": "triangles", "diamond": "diamonds",
           "cross": "crosses"}
CELL_NAMES = ("top left corner", "top", "top right corner", "left", "middle", "right", "bottom left corner", "bottom",
              "bottom right corner")
IN_ROW = ("on the left", "in the middle", "on the right")
"""A shape's place in its row (by its column)."""
IN_COLUMN = ("at the top", "in the middle", "at the bottom")
"""A shape's place in its column (by its row)."""
LONG_ATTRIBUTES = {"shapes": ("sizes",), "chart": ("bar_values",), "word": ("word_row",)}
"""The attributes only a long description states, per kind of scene (vlm_scenes.facts holds them)."""


def long_prompt(prompt: str) -> str:
    """A prompt with the instruction on a line of its own (specdraft.distill.image_prompts.with_instruction's form)."""
    return f"{prompt}\n{INSTRUCTION}"


def _counted(counts: Dict[str, int], noun=lambda name, n: name) -> str:
    return listing([f"{NUMBERS[n]} {noun(name, n)}" for name, n in counts.items() if n])


def _place_lines(objects, label: Sequence[str], key, place: Sequence[str], kind: str) -> str:
    """One sentence per row (or column): the shapes in it and their places along it, or empty."""
    lines = []
    for line, name in enumerate(label):
        items = [f"{colour} {shape} {place[cell // 3 if kind == 'column' else cell % 3]}"
                 for colour, shape, cell, _ in objects if key(cell) == line]
        lines.append(f"{name.capitalize()} {kind}: {listing(items) if items else 'empty'}.")
    return " ".join(lines)


def _relation(first: int, second: int) -> str:
    """Where cell `first` lies against cell `second`, which comes after it in reading order."""
    vertical = "above" if first // 3 < second // 3 else ""
    horizontal = {-1: "left of", 0: "", 1: "right of"}[(first % 3 > second % 3) - (first % 3 < second % 3)]
    return " and ".join(part for part in (vertical, horizontal) if part)


def _name(objects, index: int) -> str:
    """A shape by its colour and kind, or by its place in reading order where another has the same."""
    colour, shape = objects[index][:2]
    twins = sum(o[:2] == (colour, shape) for o in objects)
    return f"{colour} {shape}" if twins == 1 else f"{ORDINALS[index]} shape"


def _shape_paragraphs(scene: Scene) -> List[str]:
    objects = scene.objects
    shapes = " ".join(f"{ORDINALS[i].capitalize()} shape: {size} {colour} {shape}, {ROWS[cell // 3]} row, "
                      f"{COLUMNS[cell % 3]} column." for i, (colour, shape, cell, size) in enumerate(objects))
    pairs = " ".join(f"The {_name(objects, i)} is {_relation(objects[i][2], objects[j][2])} the {_name(objects, j)}."
                     for i in range(len(objects)) for j in range(i + 1, len(objects)))
    colours = {c: sum(o[0] == c for o in objects) for c in COLOUR_NAMES}
    kinds = {s: sum(o[1] == s for o in objects) for s in SHAPES}
    sizes = {s: sum(o[3] == s for o in objects) for s in SIZES}
    counts = (f"By colour: {_counted(colours)}. By kind: {_counted(kinds, lambda s, n: s if n == 1 else PLURALS[s])}."
              f" By size: {_counted(sizes)}.")
    empty = [CELL_NAMES[cell] for cell in range(9) if cell not in {o[2] for o in objects}]
    noun = "shape" if len(objects) == 1 else "shapes"
    summary = listing([f"{article(size)} {size} {colour} {shape} {CELLS[cell]}"
                       for colour, shape, cell, size in objects])
    return [shapes, _place_lines(objects, ROWS, lambda cell: cell // 3, IN_ROW, "row"),
            _place_lines(objects, COLUMNS, lambda cell: cell % 3, IN_COLUMN, "column"), pairs, counts,
            f"{NUMBERS[len(empty)].capitalize()} cells are empty: {listing(empty)}.",
            f"In short: {NUMBERS[len(objects)]} {noun}, {summary}."]


def _chart_paragraphs(scene: Scene) -> List[str]:
    bars = scene.bars
    each = " ".join(f"{ORDINALS[i].capitalize()} bar: {colour}, value {NUMBERS[value]}."
                    for i, (colour, value) in enumerate(bars))
    ranked = sorted(bars, key=lambda bar: -bar[1])
    against = [f"The {colour} bar is {'taller' if value > bars[i][1] else 'shorter'} than the {bars[i][0]} bar."
               for i, (colour, value) in enumerate(bars[1:])]
    unused = [colour for colour in COLOUR_NAMES if colour not in {c for c, _ in bars}]
    values = listing([f"{colour} {NUMBERS[value]}" for colour, value in bars])
    return [each, f"From tallest to shortest: {listing([f'{c} at {NUMBERS[v]}' for c, v in ranked])}.",
            " ".join(against + [f"The shortest bar is the {ranked[-1][0]} one."]),
            f"Colours not in the chart: {listing(unused)}.",
            f"In short: {NUMBERS[len(bars)]} bars, {values}; the tallest is the {ranked[0][0]} one."]


def _word_paragraphs(scene: Scene) -> List[str]:
    word, colour, row = scene.word, scene.word_colour, ROWS[scene.word_row]
    return [f"The word is written in the {row} third of the image, in {colour} letters.",
            f"Spelled out: {', '.join(word)}. It has {NUMBERS[len(word)]} letters; the first is {word[0]} and the "
            f"last is {word[-1]}.",
            f"Backwards: {', '.join(reversed(word))}.",
            f'In short: the {colour} word "{word}" in the {row} third, on a white background.']


def describe_long(scene: Scene) -> str:
    """The scene's true long description: the short one, then paragraphs separated by blank lines."""
    paragraphs = {"shapes": _shape_paragraphs, "chart": _chart_paragraphs, "word": _word_paragraphs}[scene.kind]
    return "\n\n".join([describe(scene), *(p for p in paragraphs(scene) if p)])


_ORDINAL = "|".join(ORDINALS)
_SIZE = re.compile(rf"\b(?:{_ORDINAL}) shape: ({'|'.join(SIZES)}) ", re.IGNORECASE)
_VALUE = re.compile(rf"\b(?:{_ORDINAL}) bar: (?:{'|'.join(COLOUR_NAMES)}), value ({'|'.join(NUMBERS)})\b",
                    re.IGNORECASE)
_ROW = re.compile(rf"written in the ({'|'.join(ROWS)}) third")


def read_long(text: str) -> Dict[str, object]:
    """The facts only a long description states (None for one it does not state), in vlm_scenes.facts' form."""
    sizes, values, row = _SIZE.findall(text), _VALUE.findall(text), _ROW.search(text)
    return {"sizes": sizes or None, "bar_values": [NUMBERS.index(v) for v in values] or None,
            "word_row": row.group(1) if row else None}


def score_long(truth: Dict[str, object], text: str) -> Dict[str, bool]:
    """attribute -> whether a long description states it as the scene has it (the short attributes from its first
    paragraph, then the long ones)."""
    stated = read_long(text)
    long_only = {name: stated[name] == truth.get(name) for name in LONG_ATTRIBUTES[truth["kind"]]}
    return {**score(truth, read_description(text)), **long_only}


def blind_share(scenes: Sequence[Scene]) -> float:
    """The share of a long description's words that a writer blind to its image gets wrong: 1 - difflib's match
    ratio between the long descriptions of consecutive scenes of the same kind (the words they share are the
    template's), averaged over the pairs."""
    words = {kind: [describe_long(s).split() for s in scenes if s.kind == kind] for kind in ("shapes", "chart", "word")}
    ratios = [difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()
              for texts in words.values() for a, b in zip(texts, texts[1:])]
    return 1.0 - sum(ratios) / max(len(ratios), 1)
