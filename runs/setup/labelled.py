"""Labelled sets that go with the generated corpus (runs/setup/corpus.py), for the demo's probes.

Each set's test part is about words its train part never labels, though the pretraining corpus has
them: held-out names and cities for the entity tags, held-out names, cities and things for the kinds.
A model that learned from the corpus which words behave alike can label them; a randomly initialized
model of the same shape has only the context to go on, so the probe measures what pretraining added.
"""

from __future__ import annotations

import csv
import io
import random
from collections.abc import Sequence

from runs.setup.corpus import LANGUAGES

# "Likes": a verb the corpus never has, so the frames that use it tell nothing of the word they frame.
_LIKES = {"bn": ("ভালোবাসি", "ভালোবাসো", "ভালোবাসে"), "en": ("like", "like", "likes")}
_PUNCTUATION = ".,?।"


def _words(sentence: str) -> list[str]:
    """Whitespace tokens with sentence punctuation split off, as CoNLL files have them."""
    for mark in _PUNCTUATION:
        sentence = sentence.replace(mark, f" {mark} ")
    return sentence.split()


def _halves(items: Sequence[str]) -> tuple[list[str], list[str]]:
    """Alternate items into a train half and a held-out test half."""
    return list(items[0::2]), list(items[1::2])


def _entity_sentence(rng: random.Random, code: str, names: list[str], cities: list[str]) -> tuple[list[str], list[str]]:
    language = LANGUAGES[code]
    subjects = [(subject, person) for subject, person in language.subjects if subject not in language.names]
    if rng.random() < 0.6:
        subject, person = rng.choice(names), 2
    else:
        subject, person = rng.choice(subjects)
    year = str(rng.randint(1990, 2023))
    kind = rng.random()
    if kind < 0.35:
        text = language.sentence("trip", person, subject=subject, city=rng.choice(cities), year=year)
    elif kind < 0.65:
        verbs, objects = rng.choice(language.actions)
        text = language.sentence("activity", person, subject=subject, time=rng.choice(language.times),
                                 obj=rng.choice(objects), verb=verbs[person], base=verbs[0])
    else:
        # "<subject> likes <a name, a city or a thing>": a frame the corpus never has, the same for all
        # three, so that only what the model learned about the word itself tells its tag.
        _, objects = rng.choice(language.actions)
        liked = rng.choice((rng.choice(names), rng.choice(cities), rng.choice(objects)))
        text = language.sentence("activity", person, subject=subject, time=rng.choice(language.times),
                                 obj=liked, verb=_LIKES[code][person], base=_LIKES[code][0])
    tokens = _words(text)
    tags = ["B-PER" if token in names else "B-LOC" if token in cities else "O" for token in tokens]
    return tokens, tags


def entity_sets(*, n_train: int = 600, n_test: int = 200, seed: int = 0) -> tuple[str, str]:
    """CoNLL text of sentences tagging people's names (PER) and cities (LOC), train and test parts."""
    rng = random.Random(seed)
    parts = []
    for half, size in ((0, n_train), (1, n_test)):
        lines = []
        for index in range(size):
            code = ("bn", "en")[index % 2]
            language = LANGUAGES[code]
            names, cities = _halves(language.names)[half], _halves(language.cities)[half]
            tokens, tags = _entity_sentence(rng, code, names, cities)
            lines += [f"{code}:{token} {tag}" for token, tag in zip(tokens, tags, strict=True)] + [""]
        parts.append("\n".join(lines))
    return parts[0], parts[1]


def _things(code: str, half: int) -> list[str]:
    """One half of the objects that only one of the corpus's activities takes ("bread" is eaten and
    made: left out), alternating within each activity so that both halves have things of every kind."""
    actions = LANGUAGES[code].actions
    taken = [obj for _, objects in actions for obj in objects]
    return [obj for _, objects in actions for obj in _halves([o for o in objects if taken.count(o) == 1])[half]]


def kind_sets(*, n_train: int = 600, n_test: int = 200, seed: int = 0) -> tuple[str, str]:
    """CSV ``text,label`` of sentences that say someone likes a person, a place or a thing, labelled
    with which: "The farmer likes Khulna at noon." is a place. The frame is the same for all three and
    the corpus never has it, and the test part names people, cities and things that the train part
    never does, so only what the model learned about the liked word itself tells the label."""
    rng = random.Random(seed)
    parts = []
    for half, size in ((0, n_train), (1, n_test)):
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(["text", "label"])
        for index in range(size):
            code = ("bn", "en")[index % 2]
            language = LANGUAGES[code]
            kinds = {"person": _halves(language.names)[half], "place": _halves(language.cities)[half],
                     "thing": _things(code, half)}
            kind = rng.choice(list(kinds))
            # No name as the subject, so that the only person a sentence names is the liked one.
            subject, person = rng.choice([(s, p) for s, p in language.subjects if s not in language.names])
            text = language.sentence("activity", person, subject=subject, time=rng.choice(language.times),
                                     obj=rng.choice(kinds[kind]), verb=_LIKES[code][person],
                                     base=_LIKES[code][0])
            writer.writerow([text, kind])
        parts.append(out.getvalue())
    return parts[0], parts[1]
