"""A task suite whose answers a program checks (checks.py): small arithmetic, unit conversion, list sorting and
reversal, counting, field extraction, JSON formatting and the like, each a template that draws its numbers and
words from a seeded generator. Two disjoint sets of templates: `train` (to mine labels on) and `heldout` (to
measure quality on templates no label came from).

As a prompt set (task_sets.py): `tasks:SPLIT`, `tasks:SPLIT:COUNT` (the first COUNT items; default 500) or
`tasks:SPLIT:START..END` (items START to END - 1: say, labels mined on a held-out template's items that a bench of
its first items never sees), read like any prompt file (specdraft.data.sources); item i of a split is the same
whatever the count. Each record is a `prompt`, its `check` and `answer` (checks.py) and its `template`.
"""
from __future__ import annotations

import random
from typing import Callable, Dict, List, Tuple

from specdraft.core.errors import choices_error

DEFAULT_COUNT = 500
FRUITS = ["apple", "banana", "cherry", "grape", "lemon", "mango", "orange", "peach", "pear", "plum"]
ANIMALS = ["cat", "dog", "horse", "lion", "mouse", "rabbit", "sheep", "tiger", "wolf", "zebra"]
NAMES = ["Alice", "Bob", "Carol", "David", "Emma", "Frank", "Grace", "Henry", "Irene", "James"]
CITIES = ["Paris", "London", "Tokyo", "Madrid", "Berlin", "Rome", "Cairo", "Lima", "Oslo", "Dublin"]
COLORS = ["red", "blue", "green", "yellow", "black", "white", "purple", "orange", "pink", "brown"]
CAPITALS = [("France", "Paris"), ("Japan", "Tokyo"), ("Italy", "Rome"), ("Spain", "Madrid"), ("Germany", "Berlin"),
            ("Egypt", "Cairo"), ("England", "London"), ("Russia", "Moscow"), ("China", "Beijing"),
            ("Greece", "Athens"), ("Canada", "Ottawa"), ("Peru", "Lima")]

Template = Callable[[random.Random], dict]


def _item(prompt: str, check: str, answer, **extra) -> dict:
    return {"prompt": prompt, "check": check, "answer": answer, **extra}


def _numbers(rng: random.Random, count: int, low: int = 1, high: int = 50) -> List[int]:
    return rng.sample(range(low, high), count)


def _unsorted(rng: random.Random, count: int) -> List[int]:
    values = _numbers(rng, count)
    while values == sorted(values) or values == sorted(values, reverse=True):
        rng.shuffle(values)
    return values


def _person(rng: random.Random) -> Tuple[str, str, int]:
    """A name, a city and an adult age, drawn in that order."""
    return rng.choice(NAMES), rng.choice(CITIES), rng.randint(18, 80)


def _conversion(rng: random.Random, small: str, large: str, factor: int) -> dict:
    amount = rng.randint(2, 9)
    return _item(f"How many {small} are in {amount} {large}?", "number", amount * factor)


def _sorting(rng: random.Random, order: str, descending: bool) -> dict:
    values = _unsorted(rng, rng.randint(3, 5))
    return _item(f"Sort these numbers {order}: {', '.join(map(str, values))}.", "list",
                 sorted(values, reverse=descending))


# ---- train templates --------------------------------------------------------------------------------------
def add(rng):
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    return _item(f"What is {a} + {b}?", "number", a + b)


def multiply(rng):
    a, b = rng.randint(2, 9), rng.randint(2, 9)
    return _item(f"What is {a} times {b}?", "number", a * b)


def km_to_m(rng):
    return _conversion(rng, "meters", "kilometers", 1000)


def hours_to_minutes(rng):
    return _conversion(rng, "minutes", "hours", 60)


def sort_numbers(rng):
    return _sorting(rng, "from smallest to largest", descending=False)


def reverse_words(rng):
    words = rng.sample(FRUITS, rng.randint(3, 4))
    return _item(f"Reverse the order of this list: {', '.join(words)}.", "list", words[::-1])


def largest(rng):
    values = _numbers(rng, rng.randint(3, 5))
    return _item(f"Which is the largest number in this list: {', '.join(map(str, values))}?", "number", max(values))


def count_items(rng):
    words = rng.sample(ANIMALS, rng.randint(2, 6))
    return _item(f"How many animals are in this list: {', '.join(words)}?", "number", len(words))


def extract_age(rng):
    name, city, age = _person(rng)
    return _item(f"Name: {name}\nAge: {age}\nCity: {city}\n\nWhat is the age of this person?", "number", age)


def extract_city(rng):
    name, city, age = _person(rng)
    return _item(f"Name: {name}\nCity: {city}\nAge: {age}\n\nWhich city does this person live in?", "text", city)


def json_person(rng):
    name, age = rng.choice(NAMES), rng.randint(18, 80)
    return _item(f'Write a JSON object with the key "name" set to "{name}" and the key "age" set to {age}.', "json",
                 {"name": name, "age": age})


def capital(rng):
    country, city = rng.choice(CAPITALS[:6])
    return _item(f"What is the capital of {country}?", "text", city)


def extract_price(rng):
    item, price, color = rng.choice(FRUITS), rng.randint(2, 30), rng.choice(COLORS)
    return _item(f"Product: {item}\nColor: {color}\nPrice: {price} dollars\n\nWhat is the price of this product?",
                 "number", price)


def extract_id(rng):
    name, code = rng.choice(NAMES), rng.randint(1000, 9999)
    return _item(f"Name: {name}\nID: {code}\nCity: {rng.choice(CITIES)}\n\nWhat is the ID number?", "number", code)


def extract_pet(rng):
    owner, animal, age = rng.choice(NAMES), rng.choice(ANIMALS), rng.randint(2, 15)
    return _item(f"Owner: {owner}\nPet: {animal}\nAge: {age}\n\nWhat kind of animal is the pet?", "text", animal,
                 reject=[owner])


def extract_product(rng):
    item, price = rng.choice(FRUITS), rng.randint(2, 30)
    color = rng.choice([color for color in COLORS if color != item])  # "orange" is both
    return _item(f"Product: {item}\nColor: {color}\nPrice: {price} dollars\n\nWhich product is this?", "text", item,
                 reject=[color])


def json_country(rng):
    country, city = rng.choice(CAPITALS[:6])
    return _item(f'Write a JSON object with the key "country" set to "{country}" and the key "capital" set to '
                 f'"{city}".', "json", {"country": country, "capital": city})


def json_year(rng):
    title, year = rng.choice(NAMES), rng.randint(1950, 2020)
    return _item(f'Write a JSON object with the key "title" set to "{title}" and the key "year" set to {year}.',
                 "json", {"title": title, "year": year})


def first_word(rng):
    words = rng.sample(ANIMALS, rng.randint(3, 5))
    return _item(f"What is the first word in this list: {', '.join(words)}?", "text", words[0], reject=words[2:])


def opposite(rng):
    word, answer = rng.choice([("hot", "cold"), ("big", "small"), ("day", "night"), ("up", "down"),
                               ("fast", "slow"), ("happy", "sad"), ("open", "closed"), ("wet", "dry")])
    return _item(f"What is the opposite of {word}? Answer with one word.", "text", answer)


def extract_year(rng):
    title, year = f"The {rng.choice(COLORS).title()} {rng.choice(ANIMALS).title()}", rng.randint(1950, 2020)
    return _item(f"Title: {title}\nYear: {year}\nAuthor: {rng.choice(NAMES)}\n\nIn which year was this book "
                 f"published?", "number", year)


def extract_score(rng):
    name, city, score = rng.choice(NAMES), rng.choice(CITIES), rng.randint(10, 99)
    return _item(f"Player: {name}\nTeam: {city}\nScore: {score}\n\nWhat is the player's score?", "number", score)


def extract_team(rng):
    name, city, score = rng.choice(NAMES), rng.choice(CITIES), rng.randint(10, 99)
    return _item(f"Player: {name}\nScore: {score}\nTeam: {city}\n\nWhich team does the player play for?", "text",
                 city, reject=[name])


def extract_owner(rng):
    owner, animal, age = rng.choice(NAMES), rng.choice(ANIMALS), rng.randint(2, 15)
    return _item(f"Pet: {animal}\nAge: {age}\nOwner: {owner}\n\nWho owns the pet?", "text", owner)


def sentence_age(rng):
    name, city, age = _person(rng)
    return _item(f"{name} is {age} years old and lives in {city}. How old is {name}?", "number", age)


def sentence_city(rng):
    name, city, age = _person(rng)
    return _item(f"{name} lives in {city} and is {age} years old. In which city does {name} live?", "text", city)


def sentence_price(rng):
    item, price = rng.choice(FRUITS), rng.randint(2, 30)
    return _item(f"A {item} costs {price} dollars at the market. How much does the {item} cost?", "number", price)


def sentence_pet(rng):
    name, animal = rng.choice(NAMES), rng.choice(ANIMALS)
    return _item(f"{name} has a pet {animal} at home. What kind of animal is {name}'s pet?", "text", animal)


def json_pet(rng):
    animal, name = rng.choice(ANIMALS), rng.choice(NAMES)
    return _item(f'Write a JSON object with the key "animal" set to "{animal}" and the key "owner" set to "{name}".',
                 "json", {"animal": animal, "owner": name})


# ---- held-out templates -----------------------------------------------------------------------------------
def subtract(rng):
    a = rng.randint(20, 90)
    b = rng.randint(2, a - 5)
    return _item(f"What is {a} minus {b}?", "number", a - b)


def kg_to_g(rng):
    return _conversion(rng, "grams", "kilograms", 1000)


def smallest(rng):
    values = _numbers(rng, rng.randint(3, 5))
    return _item(f"Which is the smallest number in this list: {', '.join(map(str, values))}?", "number",
                 min(values))


def sort_descending(rng):
    return _sorting(rng, "from largest to smallest", descending=True)


def extract_name(rng):
    name, city, age = _person(rng)
    return _item(f"City: {city}\nAge: {age}\nName: {name}\n\nWhat is the name of this person?", "text", name,
                 reject=[city])


def json_city(rng):
    city, color = rng.choice(CITIES), rng.choice(COLORS)
    return _item(f'Write a JSON object with the key "city" set to "{city}" and the key "color" set to "{color}".',
                 "json", {"city": city, "color": color})


def extract_email(rng):
    name = rng.choice(NAMES)
    email = f"{name.lower()}{rng.randint(1, 99)}@example.com"
    return _item(f"Name: {name}\nEmail: {email}\nPhone: 555-{rng.randint(1000, 9999)}\n\nWhat is the email address?",
                 "text", email)


def sum_of(rng):
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    return _item(f"What is the sum of {a} and {b}?", "number", a + b)


def extract_phone(rng):
    name, phone = rng.choice(NAMES), f"555-{rng.randint(1000, 9999)}"
    return _item(f"Name: {name}\nPhone: {phone}\nCity: {rng.choice(CITIES)}\n\nWhat is the phone number?", "text",
                 phone)


def extract_color(rng):
    item, color, price = rng.choice(FRUITS), rng.choice(COLORS), rng.randint(2, 30)
    return _item(f"Product: {item}\nPrice: {price} dollars\nColor: {color}\n\nWhat color is this product?", "text",
                 color)


def json_three(rng):
    name, city, age = _person(rng)
    return _item(f'Write a JSON object with the keys "name", "city" and "age" set to "{name}", "{city}" and {age}.',
                 "json", {"name": name, "city": city, "age": age})


def capital_of(rng):
    country, city = rng.choice(CAPITALS[6:])
    return _item(f"Which city is the capital of {country}?", "text", city)


def count_colors(rng):
    words = rng.sample(COLORS, rng.randint(2, 6))
    return _item(f"How many colors are in this list: {', '.join(words)}?", "number", len(words))


TEMPLATES: Dict[str, List[Template]] = {  # the kinds SmolLM2-135M-Instruct mostly solves come twice
    "train": [add, largest, extract_age, extract_city, extract_price, json_person, capital, multiply, km_to_m,
              hours_to_minutes, sort_numbers, reverse_words, count_items, add, largest, extract_age, extract_city,
              extract_price, json_person, extract_id, extract_pet, extract_product, json_country, json_year,
              extract_id, extract_pet, extract_product, json_country, json_year, first_word, opposite, extract_year,
              extract_score, extract_team, extract_owner, sentence_age, sentence_city, sentence_price, sentence_pet,
              json_pet],
    "heldout": [json_city, json_three, extract_email, extract_phone, capital_of, extract_name, smallest, sum_of,
                extract_color, subtract, kg_to_g, sort_descending, count_colors, json_city, json_three, extract_email,
                extract_phone, capital_of],
}


def task_records(split: str, count: int = DEFAULT_COUNT, start: int = 0) -> List[dict]:
    """Items `start` to `start + count - 1` of a split: item i uses template i mod T, drawn from a generator seeded
    by (split, i), so a longer set starts with the shorter one."""
    if split not in TEMPLATES:
        raise choices_error("task split", split, sorted(TEMPLATES))
    templates = TEMPLATES[split]
    records = []
    for index in range(start, start + count):
        template = templates[index % len(templates)]
        rng = random.Random(f"{split}:{index}")
        records.append({**template(rng), "template": template.__name__})
    return records

