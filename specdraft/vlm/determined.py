"""Answers that the image determines token by token, for specdraft/vlm/scenes.py's DETERMINED_KINDS: each scene
read out item by item in a fixed form, so that nearly every token that is not a label is one the image decides (a
colour, a shape, a word, a value) and a draft blind to the image can only guess it. The small VLM learns to answer
each kind's questions so, with or without the long-answer instruction (the listing is as long as the image makes
it); `read_listing` reads an answer back and `score_listing` scores it item by item against the drawn scene.

  grid    Row 1: red circle, empty, blue square, green cross.      one line a row, each cell `COLOUR SHAPE` or
          Row 2: ...                                               `empty`, left to right
  words   Line 1: lamp, rain.                                      one line a line of the image, its words left
          Line 2: ...                                              to right
  values  Bar 1: red, 7.                                           one line a bar, left to right: its colour and
          Bar 2: ...                                               its value
"""
from __future__ import annotations

import re
from typing import Dict, List, Optional, Sequence

from specdraft.vlm.scenes import (COLOUR_NAMES, GRID, READ_VALUES, SHAPES, VALUE_BARS, WORD_LINES, WORD_LIST,
                                  WORDS_PER_LINE, Scene, facts)

QUESTIONS = {"grid": ("List the cells of this grid, row by row.", "What is in each cell of the grid?",
                      "Read out the grid cell by cell."),
             "words": ("Transcribe the words in this image.", "Read out every word, line by line.",
                       "What words are written in this image?"),
             "values": ("Read out the colour and value of each bar.", "What is the value of every bar in this chart?",
                        "List the bars with their values.")}
"""Each determined kind's questions (the VLM answers any of them with the kind's listing)."""
ITEMS = {"grid": GRID * GRID, "words": WORD_LINES * WORDS_PER_LINE, "values": VALUE_BARS}
"""How many items a scene of each kind lists."""
EMPTY = "empty"


def question(kind: str, number: int) -> str:
    """The number-th prompt's question for a scene of `kind` (they take turns)."""
    return QUESTIONS[kind][number % len(QUESTIONS[kind])]


def items(facts: Dict[str, object]) -> List[object]:
    """A determined scene's items (scenes.facts' form), in reading order, as the listing states them."""
    if facts["kind"] == "grid":
        return [EMPTY if cell is None else " ".join(cell) for cell in facts["cells"]]
    if facts["kind"] == "words":
        return list(facts["words"])
    return [f"{colour}, {value}" for colour, value in facts["bars"]]


def listing_of_items(kind: str, stated: Sequence[object]) -> str:
    """The listing (module docstring) of a kind's items in reading order."""
    if kind == "grid":
        return "\n".join(f"Row {row + 1}: {', '.join(stated[row * GRID:(row + 1) * GRID])}." for row in range(GRID))
    if kind == "words":
        return "\n".join(f"Line {line + 1}: {', '.join(stated[line * WORDS_PER_LINE:(line + 1) * WORDS_PER_LINE])}."
                         for line in range(WORD_LINES))
    return "\n".join(f"Bar {number + 1}: {item}." for number, item in enumerate(stated))


def listing(scene: Scene) -> str:
    """The scene's true answer: its items listed (module docstring)."""
    return listing_of_items(scene.kind, items(facts(scene)))


_COLOUR, _SHAPE = "|".join(COLOUR_NAMES), "|".join(SHAPES)
_CELL = re.compile(rf"^(?:{EMPTY}|(?:{_COLOUR}) (?:{_SHAPE}))$")
_LINE = {"grid": re.compile(r"^\s*Row (\d+): (.*?)\.?\s*$", re.MULTILINE),
         "words": re.compile(r"^\s*Line (\d+): (.*?)\.?\s*$", re.MULTILINE),
         "values": re.compile(rf"^\s*Bar (\d+): ((?:{_COLOUR}), (?:{'|'.join(map(str, READ_VALUES))}))\.?\s*$",
                              re.MULTILINE)}
_WIDTH = {"grid": GRID, "words": WORDS_PER_LINE, "values": 1}


def read_listing(kind: str, text: str) -> List[Optional[str]]:
    """The items an answer states, in reading order (None where it states none): each numbered line's first
    statement, split into the kind's items per line; an item that is no colour-and-shape or `empty` (a grid's), or
    no word of the list (a line's), is None."""
    width, found = _WIDTH[kind], [None] * ITEMS[kind]
    seen = set()
    for match in _LINE[kind].finditer(text):
        number = int(match.group(1)) - 1
        if not 0 <= number < ITEMS[kind] // width or number in seen:
            continue
        seen.add(number)
        parts = [match.group(2)] if kind == "values" else [part.strip() for part in match.group(2).split(",")]
        for offset, part in enumerate(parts[:width]):
            valid = _CELL.match(part) if kind == "grid" else (part in WORD_LIST if kind == "words" else True)
            found[number * width + offset] = part if valid else None
    return found


def score_listing(facts: Dict[str, object], text: str) -> Dict[str, object]:
    """An answer against its scene: the items it states right (`hits` of `items`), and whether all are (`exact`)."""
    truth, stated = items(facts), read_listing(facts["kind"], text)
    hits = sum(said == true for said, true in zip(stated, truth))
    return {"hits": hits, "items": len(truth), "exact": hits == len(truth)}


def accuracy(records: List[dict], answers: List[str]) -> Dict[str, dict]:
    """Per determined kind: the share of items answered right, of answers right in every item, how many answers,
    and chance (the same scores for the true listing of another image of the kind: fluent, blind to this one)."""
    report = {}
    for kind in ITEMS:
        pairs = [(record["facts"], answer) for record, answer in zip(records, answers)
                 if record["facts"]["kind"] == kind]
        if not pairs:
            continue
        scores = [score_listing(truth, answer) for truth, answer in pairs]
        others = [score_listing(truth, listing_of_items(kind, items(other)))
                  for (truth, _), (other, _) in zip(pairs, pairs[1:] + pairs[:1])] if len(pairs) > 1 else []
        report[kind] = {"item_accuracy": _share(scores), "exact": _exact(scores), "n": len(pairs),
                        "item_chance": _share(others) if others else None,
                        "exact_chance": _exact(others) if others else None}
    return report


def _share(scores: List[dict]) -> float:
    return round(sum(score["hits"] for score in scores) / max(1, sum(score["items"] for score in scores)), 4)


def _exact(scores: List[dict]) -> float:
    return round(sum(score["exact"] for score in scores) / max(1, len(scores)), 4)


def accuracy_table(report: Dict[str, dict]) -> str:
    lines = ["| determined task | items right | chance | answers right in every item | chance | n |",
             "|---|---|---|---|---|---|"]
    for kind, row in report.items():
        chance = "-" if row["item_chance"] is None else f"{row['item_chance']:.3f}"
        exact_chance = "-" if row["exact_chance"] is None else f"{row['exact_chance']:.3f}"
        lines.append(f"| {kind} | {row['item_accuracy']:.3f} | {chance} | {row['exact']:.3f} | {exact_chance} | "
                     f"{row['n']} |")
    return "\n".join(lines)
