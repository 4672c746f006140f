"""Labelled sets that go with the generated corpus (runs/setup/corpus.py), for the demo's probes.

Each set's test part is about words its train part never labels, though the pretraining corpus has
them: held-out names and cities for the entity tags, held-out objects for the topics. A model that
learned from the corpus which words behave alike can label them; a randomly initialized model of the
same shape has only the context to go on, so the probe measures what pretraining added.
"""

from __future__ import annotations

import csv
import io
import random
from collections.abc import Sequence

from runs.setup.corpus import LANGUAGES

# The verb that stands in for an action's own in half the topic sentences, so that only the object tells the topic.
_LIKES = {"bn": ("ভালোবাসি", "ভালোবাসো", "ভালোবাসে"), "en": ("like", "like", "likes")}
_TOPICS = ("food", "reading", "writing", "watching", "shopping", "music", "games", "cooking")  # corpus actions, in order
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


def _topic_objects(code: str) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Each topic's objects that no other action takes (so that the object alone tells the topic), and
    those that another action takes too ("books" are read and bought: only the verb tells the topic)."""
    actions = LANGUAGES[code].actions
    counts: dict[str, int] = {}
    for _, objects in actions:
        for obj in objects:
            counts[obj] = counts.get(obj, 0) + 1
    own, shared = ({topic: [obj for obj in objects if (counts[obj] == 1) == alone]
                    for topic, (_, objects) in zip(_TOPICS, actions, strict=True)} for alone in (True, False))
    return own, shared


def topic_sets(*, n_train: int = 600, n_test: int = 200, seed: int = 0) -> tuple[str, str]:
    """CSV ``text,label`` of sentences of an activity and its topic, train and test parts: half say the
    action's own verb, half only "like", so that there only the object tells the topic. Some of the
    train part's sentences with the verb name an object that two actions take, so that a fine-tune
    has to learn the verbs too rather than only the train part's objects."""
    rng = random.Random(seed)
    parts = []
    for half, size in ((0, n_train), (1, n_test)):
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(["text", "label"])
        for index in range(size):
            code = ("bn", "en")[index % 2]
            language = LANGUAGES[code]
            own, shared = _topic_objects(code)
            topic, objects = rng.choice(list(own.items()))
            subject, person = rng.choice(language.subjects)
            liked = rng.random() < 0.5
            verbs = _LIKES[code] if liked else dict(zip(_TOPICS, (v for v, _ in language.actions)))[topic]
            candidates = _halves(objects)[half]
            if not half and not liked and shared[topic] and rng.random() < 0.5:
                candidates = shared[topic]
            text = language.sentence("activity", person, subject=subject, time=rng.choice(language.times),
                                     obj=rng.choice(candidates), verb=verbs[person], base=verbs[0])
            writer.writerow([text, topic])
        parts.append(out.getvalue())
    return parts[0], parts[1]
