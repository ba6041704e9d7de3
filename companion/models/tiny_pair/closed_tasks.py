"""The "closed" task set: answers that need no copying, with ambiguity placed on purpose.

Why: a 5M-parameter model trained for under an hour does not learn to copy a free list from its
prompt (the retired "mixed" set's copy tasks were right 0 % of the time), so its uncertain steps there
were guesses over every name it had seen, nothing like a chat LLM's. Here every answer's content
follows from a memorised fact (a capital, an animal's sound, the days of a month) or a rule over
a small closed set (the day after Friday, the opposite of a word), and the only items carried
over from the request belong to a closed set the model meets thousands of times.

Where an LLM is uncertain, a few continuations are all plausible. The generator builds that in:
at chosen places an answer picks one of two or three equally valid alternatives, with fixed
unequal weights (:data:`W2`, :data:`W3`): its wording (``The capital of Peru is Lima.`` /
``Lima is the capital of Peru.`` / ``It is Lima.``), an open choice of content where the world
offers one (a ripe apple is red or green; a grape green or purple), and its closing (none, or
one of two closing sentences, :data:`CLOSINGS`). A model that learns the corpus is near-certain
everywhere except at those places, where its mass is split over those few tokens.

Every alternative goes through ``companion.models.tiny_pair.chat_basics._answer`` (looked up on the
module at call time), so :func:`companion.models.tiny_pair.tasks_report.valid_answers` can enumerate every
answer the generator could have written. The facts below are written for this module.
"""
from __future__ import annotations

import random

from companion.models.tiny_pair import chat_basics as chat
from companion.models.tiny_pair.chat_basics import CAPITALS, MONTHS, WEEKDAYS, Material, Task

#: Weights of two alternatives, unequal so that the most likely one is clear (a greedy decoder
#: and a drafter agree on it) while the other keeps a large share.
W2 = (0.65, 0.35)
#: Weights of three alternatives, unequal for the same reason.
W3 = (0.55, 0.3, 0.15)

#: How an answer ends, nothing more (most often) or one of two closing sentences.
CLOSINGS = ("", "\n\nHope that helps!", "\n\nLet me know if you need anything else.")

LETTERS = tuple("ABCDEFGHIJKLMNOPQRSTUVWXYZ")

OPPOSITES = (
    ("hot", "cold"), ("big", "small"), ("fast", "slow"), ("up", "down"), ("open", "closed"),
    ("early", "late"), ("happy", "sad"), ("full", "empty"), ("hard", "soft"), ("high", "low"),
    ("long", "short"), ("wet", "dry"), ("thick", "thin"), ("rich", "poor"), ("loud", "quiet"),
    ("strong", "weak"), ("inside", "outside"), ("north", "south"), ("east", "west"), ("day", "night"),
    ("win", "lose"), ("push", "pull"), ("buy", "sell"), ("start", "finish"), ("true", "false"),
    ("clean", "dirty"), ("light", "dark"), ("above", "below"), ("always", "never"), ("cheap", "expensive"),
)

#: Each animal with the sound it makes and the name of its young, one noun form per animal.
ANIMAL_FACTS = (
    ("dog", "barks", "puppy"), ("cat", "meows", "kitten"), ("horse", "neighs", "foal"), ("cow", "moos", "calf"),
    ("sheep", "bleats", "lamb"), ("goat", "bleats", "kid"), ("duck", "quacks", "duckling"),
    ("lion", "roars", "cub"), ("bear", "growls", "cub"), ("wolf", "howls", "pup"), ("owl", "hoots", "owlet"),
    ("frog", "croaks", "tadpole"), ("pig", "oinks", "piglet"), ("goose", "honks", "gosling"),
    ("mouse", "squeaks", "pup"), ("donkey", "brays", "foal"), ("hen", "clucks", "chick"), ("tiger", "roars", "cub"),
)

#: Irregular and spelling-rule plurals.
PLURALS = (
    ("mouse", "mice"), ("child", "children"), ("foot", "feet"), ("tooth", "teeth"), ("goose", "geese"),
    ("man", "men"), ("woman", "women"), ("person", "people"), ("ox", "oxen"), ("sheep", "sheep"),
    ("fish", "fish"), ("deer", "deer"), ("leaf", "leaves"), ("knife", "knives"), ("wolf", "wolves"),
    ("life", "lives"), ("half", "halves"), ("cactus", "cacti"), ("potato", "potatoes"), ("tomato", "tomatoes"),
    ("box", "boxes"), ("bus", "buses"), ("city", "cities"), ("baby", "babies"), ("party", "parties"),
)

#: Each fruit with the colours a ripe one has (two where both are common, an open choice of content).
FRUIT_COLORS = (
    ("banana", ("yellow",)), ("lemon", ("yellow",)), ("lime", ("green",)), ("cherry", ("red",)),
    ("plum", ("purple",)), ("strawberry", ("red",)), ("blueberry", ("blue",)), ("raspberry", ("red",)),
    ("coconut", ("brown",)), ("apricot", ("orange",)), ("apple", ("red", "green")), ("grape", ("green", "purple")),
    ("pear", ("green", "yellow")), ("mango", ("yellow", "orange")), ("fig", ("purple", "green")),
    ("peach", ("orange", "pink")),
)

DAYS_IN_MONTH = dict(zip(MONTHS, ("31 days", "28 days, or 29 in a leap year", "31 days", "30 days", "31 days",
                                  "30 days", "31 days", "31 days", "30 days", "31 days", "30 days", "31 days")))

#: Category -> members; no word belongs to two categories.
CATEGORIES = {
    "fruit": ("apple", "banana", "cherry", "grape", "lemon", "mango", "melon", "peach", "pear", "plum", "kiwi"),
    "animal": ("cat", "dog", "horse", "tiger", "lion", "zebra", "eagle", "shark", "whale", "rabbit", "otter",
               "panda", "camel"),
    "color": ("red", "blue", "green", "yellow", "purple", "black", "white", "gray", "pink", "brown"),
    "tool": ("hammer", "wrench", "saw", "drill", "chisel", "ladder", "shovel", "rake", "pliers", "stapler"),
    "job": ("teacher", "engineer", "doctor", "nurse", "pilot", "farmer", "baker", "painter", "lawyer", "plumber"),
}


def _a(word: str) -> str:
    """``word`` with its indefinite article."""
    return ("an " if word[0] in "aeiou" else "a ") + word


def _pick(rng: random.Random, *options: str) -> str:
    return rng.choice(options)


def task_capital(rng: random.Random, m: Material) -> tuple[str, str]:
    """A (question, answer) pair on a country's capital."""
    country, capital = rng.choice(CAPITALS)
    if rng.random() < 0.7:
        q = _pick(rng, f"What is the capital of {country}?", f"Which city is the capital of {country}?",
                  f"Name the capital city of {country}.", f"Tell me the capital of {country}.")
        return q, chat._answer(rng, f"The capital of {country} is {capital}.", f"{capital} is the capital of {country}.",
                               f"It is {capital}.", weights=W3)
    q = _pick(rng, f"{capital} is the capital of which country?", f"Which country has {capital} as its capital?",
              f"Of which country is {capital} the capital?")
    return q, chat._answer(rng, f"{capital} is the capital of {country}.", f"It is the capital of {country}.",
                           f"{country}.", weights=W3)


def task_next_name(rng: random.Random, m: Material) -> tuple[str, str]:
    """A (question, answer) pair on the weekday or month after (or before) a given one."""
    seq, what = (WEEKDAYS, "day") if rng.random() < 0.5 else (MONTHS, "month")
    i = rng.randrange(len(seq))
    x = seq[i]
    if rng.random() < 0.6:
        y = seq[(i + 1) % len(seq)]
        q = _pick(rng, f"Which {what} comes after {x}?", f"What is the {what} after {x}?",
                  f"If it is {x} now, what {what} is next?")
        return q, chat._answer(rng, f"The {what} after {x} is {y}.", f"It is {y}.", f"{y} comes after {x}.", weights=W3)
    y = seq[(i - 1) % len(seq)]
    q = _pick(rng, f"Which {what} comes before {x}?", f"What is the {what} before {x}?",
              f"If it is {x} now, what {what} was it before?")
    return q, chat._answer(rng, f"The {what} before {x} is {y}.", f"It is {y}.", f"{y} comes before {x}.", weights=W3)


def task_sequence(rng: random.Random, m: Material) -> tuple[str, str]:
    """A (question, answer) pair continuing a run of weekdays, months or letters."""
    seq = (WEEKDAYS, MONTHS, LETTERS)[rng.randrange(3)]
    i = rng.randrange(len(seq))
    shown = [seq[(i + j) % len(seq)] for j in range(rng.randint(3, 5))]
    n_more = rng.randint(3, 5)
    more = [seq[(i + len(shown) + j) % len(seq)] for j in range(n_more)]
    q = _pick(rng, f"Continue this sequence with {n_more} more items: {', '.join(shown)}",
              f"What are the next {n_more} items? {', '.join(shown)}, ...")
    return q, chat._answer(rng, "", "The next ones are: ", "Next: ", weights=W3) + ", ".join(more)


def task_opposite(rng: random.Random, m: Material) -> tuple[str, str]:
    """A (question, answer) pair on a word's opposite."""
    w, o = rng.choice(OPPOSITES)
    if rng.random() < 0.5:
        w, o = o, w
    q = _pick(rng, f"What is the opposite of {w}?", f"Give me the antonym of \"{w}\".",
              f"Which word means the opposite of {w}?")
    return q, chat._answer(rng, f"The opposite of {w} is {o}.", f"It is {o}.", f"{o.capitalize()}.", weights=W3)


def task_category(rng: random.Random, m: Material) -> tuple[str, str]:
    """A (question, answer) pair on which category a thing belongs to."""
    cat = rng.choice(list(CATEGORIES))
    x = rng.choice(CATEGORIES[cat])
    others = rng.sample([c for c in CATEGORIES if c != cat], 2)
    shown = [cat] + others[: rng.randint(1, 2)]
    rng.shuffle(shown)
    choices = ", ".join(_a(c) for c in shown[:-1]) + " or " + _a(shown[-1])
    thing = x if cat == "color" else _a(x)  # "black is a color", "a hammer is a tool"
    q = _pick(rng, f"Is {thing} {choices}?", f"Which is it: {thing} is {choices}?",
              f"Pick the right category for {x}: {choices}.")
    return q, chat._answer(rng, f"{thing.capitalize()} is {_a(cat)}.", f"It is {_a(cat)}.",
                           f"{_a(cat).capitalize()}.", weights=W3)


def task_animal(rng: random.Random, m: Material) -> tuple[str, str]:
    """A (question, answer) pair on an animal's sound or its young."""
    animal, sound, young = rng.choice(ANIMAL_FACTS)
    if rng.random() < 0.5:
        q = _pick(rng, f"What sound does {_a(animal)} make?", f"What noise does {_a(animal)} make?",
                  f"How does {_a(animal)} sound?")
        return q, chat._answer(rng, f"{_a(animal).capitalize()} {sound}.", f"It {sound}.", f"The {animal} {sound}.",
                               weights=W3)
    q = _pick(rng, f"What is a baby {animal} called?", f"What do you call a young {animal}?",
              f"What is the name for a baby {animal}?")
    return q, chat._answer(rng, f"A baby {animal} is called {_a(young)}.", f"It is called {_a(young)}.",
                           f"{_a(young).capitalize()}.", weights=W3)


def task_days_in_month(rng: random.Random, m: Material) -> tuple[str, str]:
    """A (question, answer) pair on the number of days in a month."""
    month = rng.choice(MONTHS)
    days = DAYS_IN_MONTH[month]
    q = _pick(rng, f"How many days are there in {month}?", f"How many days does {month} have?",
              f"How long is {month} in days?")
    return q, chat._answer(rng, f"{month} has {days}.", f"It has {days}.", f"{days.capitalize()}.", weights=W3)


def task_month_number(rng: random.Random, m: Material) -> tuple[str, str]:
    """A (question, answer) pair between a month and its number in the year."""
    k = rng.randrange(12)
    month = MONTHS[k]
    if rng.random() < 0.5:
        q = _pick(rng, f"Which month is month number {k + 1}?", f"What is month {k + 1} of the year?",
                  f"Name month number {k + 1} of the year.")
        return q, chat._answer(rng, f"Month {k + 1} is {month}.", f"It is {month}.", f"{month}.", weights=W3)
    q = _pick(rng, f"What number is {month} among the months of the year?", f"Which month number is {month}?",
              f"In the calendar, what is the number of {month}?")
    return q, chat._answer(rng, f"{month} is month {k + 1}.", f"It is month {k + 1}.", f"{k + 1}.", weights=W3)


def task_plural(rng: random.Random, m: Material) -> tuple[str, str]:
    """A (question, answer) pair on a word's plural."""
    word, plural = rng.choice(PLURALS)
    q = _pick(rng, f"What is the plural of {word}?", f"Give the plural form of \"{word}\".",
              f"How do you write more than one {word}?")
    return q, chat._answer(rng, f"The plural of {word} is {plural}.", f"It is {plural}.", f"{plural.capitalize()}.",
                           weights=W3)


def task_fruit_color(rng: random.Random, m: Material) -> tuple[str, str]:
    """A (question, answer) pair on the color of a ripe fruit."""
    fruit, colors = rng.choice(FRUIT_COLORS)
    q = _pick(rng, f"What color is a ripe {fruit}?", f"Which color does a ripe {fruit} have?",
              f"Tell me the color of a ripe {fruit}.")
    color = chat._answer(rng, *colors, weights=W2 if len(colors) == 2 else None)
    return q, chat._answer(rng, f"A ripe {fruit} is {color}.", f"It is {color}.", f"Usually {color}.", weights=W3)


#: Task table with weights (sampling frequencies in the corpus).
CLOSED_TASKS: dict[str, tuple[Task, float]] = {
    "capital": (task_capital, 1.2), "next_name": (task_next_name, 1.0), "sequence": (task_sequence, 1.0),
    "opposite": (task_opposite, 1.0), "category": (task_category, 1.0), "animal": (task_animal, 1.0),
    "days_in_month": (task_days_in_month, 0.6), "month_number": (task_month_number, 0.8),
    "plural": (task_plural, 1.0), "fruit_color": (task_fruit_color, 0.8),
}


def closing(rng: random.Random) -> str:
    """How an answer of this set ends (an alternative like the others: :data:`CLOSINGS`, weights :data:`W3`)."""
    return chat._answer(rng, *CLOSINGS, weights=W3)
