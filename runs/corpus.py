"""Synthetic Bengali and English text for the offline demo and the tests.

Documents follow one person through a day: a subject whose verbs agree with it, objects that go
with their verbs, and times of day in order. That is enough structure for a tiny ALBERT to show a
falling masked-LM loss in a few hundred steps, and for sentence order to be predictable.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class _Language:
    subjects: Sequence[tuple[str, int]]  # (subject, grammatical person 0/1/2)
    actions: Sequence[tuple[Sequence[str], Sequence[str]]]  # (verb per person, fitting objects)
    go: Sequence[str]  # "go" per person
    went: Sequence[str]  # "went" per person
    places: Sequence[str]
    cities: Sequence[str]
    times: Sequence[str]  # in the order they happen during a day
    sightings: Sequence[tuple[str, Sequence[str]]]  # (place, things seen there)
    moods: Sequence[str]

    def number(self, rng: random.Random, n: int) -> str:
        return str(n)


_BN_DIGITS = str.maketrans("0123456789", "০১২৩৪৫৬৭৮৯")


class _Bengali(_Language):
    def number(self, rng: random.Random, n: int) -> str:
        # Most Bengali text writes Bengali digits; some mixes in ASCII ones.
        return str(n).translate(_BN_DIGITS) if rng.random() < 0.7 else str(n)

    def activity(self, s, p, verb, obj, time):
        return f"{s} {time} {obj} {verb[p]}।"

    def question(self, s, p, verb, obj, time):
        return f"{s} কি {time} {obj} {verb[p]}?"

    def going(self, s, p, place, time):
        return f"{s} {time} {place} {self.go[p]}।"

    def trip(self, s, p, city, year):
        return f"{year} সালে {s} {city} {self.went[p]}।"

    def sighting(self, time, place, n, thing):
        return f"{time} {place} {n}টি {thing} ছিল।"

    def mood(self, s, p, mood):
        return f"দিনের শেষে {s} খুব {mood}।"


class _English(_Language):
    def activity(self, s, p, verb, obj, time):
        return _capitalized(f"{s} {verb[p]} {obj} {time}.")

    def question(self, s, p, verb, obj, time):
        return f"{'Does' if p == 2 else 'Do'} {s} {verb[0]} {obj} {time}?"

    def going(self, s, p, place, time):
        return _capitalized(f"{s} {self.go[p]} {place} {time}.")

    def trip(self, s, p, city, year):
        return f"In {year}, {s} {self.went[p]} to {city}."

    def sighting(self, time, place, n, thing):
        return _capitalized(f"{time}, there were {n} {thing} {place}.")

    def mood(self, s, p, mood):
        return f"At the end of the day, {s} {('am', 'are', 'is')[p]} very {mood}."


def _capitalized(sentence: str) -> str:
    return sentence[0].upper() + sentence[1:]


# Words chosen to cover every vowel sign (া ি ী ু ূ ৃ ে ৈ ো ৌ), hasanta conjuncts (ক্ষ ন্ধ ন্দ্র ট্ট ক্র),
# য-phala, ঁ ং ঃ ৎ and য়/ড়.
_BENGALI = _Bengali(
    subjects=[
        ("আমি", 0), ("তুমি", 1), ("সে", 2), ("রহিম", 2), ("সীমা", 2), ("কৃষক", 2), ("শিক্ষক", 2),
        ("আমার বন্ধু", 2), ("বৃদ্ধ লোকটি", 2), ("ছোট মেয়েটি", 2), ("নৌকার মাঝি", 2),
    ],
    actions=[
        (("খাই", "খাও", "খায়"), ("ভাত", "মাছ", "রুটি", "আম", "মিষ্টি", "ডাল")),
        (("পড়ি", "পড়ো", "পড়ে"), ("বই", "খবরের কাগজ", "কবিতা", "চিঠি", "গল্পের বই")),
        (("লিখি", "লেখো", "লেখে"), ("চিঠি", "কবিতা", "গল্প", "ডায়েরি")),
        (("দেখি", "দেখো", "দেখে"), ("চাঁদ", "নৌকা", "পাখি", "বৃষ্টি", "সূর্যোদয়", "মৌমাছি")),
        (("কিনি", "কেনো", "কেনে"), ("ফল", "বই", "জামা", "সবজি", "ডিম")),
        (("গাই", "গাও", "গায়"), ("গান", "রবীন্দ্রসংগীত", "লোকগীতি")),
        (("খেলি", "খেলো", "খেলে"), ("ফুটবল", "ক্রিকেট", "দাবা")),
        (("তৈরি করি", "তৈরি করো", "তৈরি করে"), ("রুটি", "খাবার", "চা")),
    ],
    go=("যাই", "যাও", "যায়"),
    went=("গিয়েছিলাম", "গিয়েছিলে", "গিয়েছিল"),
    places=["স্কুলে", "বাজারে", "নদীর ধারে", "মাঠে", "অফিসে", "গ্রামে", "হাসপাতালে", "দূরের শহরে", "উৎসবে"],
    cities=["ঢাকায়", "কলকাতায়", "চট্টগ্রামে", "সিলেটে", "খুলনায়"],
    times=["ভোরে", "সকালে", "দুপুরে", "বিকেলে", "সন্ধ্যায়", "রাতে"],
    sightings=[
        ("বাগানে", ("ফুল", "পাখি", "গাছ")),
        ("নদীতে", ("নৌকা", "মাছ")),
        ("আকাশে", ("পাখি", "মেঘ")),
        ("মাঠে", ("গরু", "ছেলে")),
    ],
    moods=["খুশি", "ক্লান্ত", "শান্ত", "দুঃখী"],
)

_ENGLISH = _English(
    subjects=[
        ("I", 0), ("you", 1), ("he", 2), ("she", 2), ("Rahim", 2), ("Sima", 2), ("the farmer", 2),
        ("the teacher", 2), ("my friend", 2), ("the old man", 2), ("the little girl", 2), ("the boatman", 2),
    ],
    actions=[
        (("eat", "eat", "eats"), ("rice", "fish", "bread", "mangoes", "sweets", "lentils")),
        (("read", "read", "reads"), ("books", "the newspaper", "a poem", "letters", "a storybook")),
        (("write", "write", "writes"), ("letters", "poems", "stories", "a diary")),
        (("watch", "watch", "watches"), ("the moon", "the boats", "birds", "the rain", "the sunrise", "the bees")),
        (("buy", "buy", "buys"), ("fruit", "books", "shirts", "vegetables", "eggs")),
        (("sing", "sing", "sings"), ("songs", "Tagore songs", "folk songs")),
        (("play", "play", "plays"), ("football", "cricket", "chess")),
        (("make", "make", "makes"), ("bread", "food", "tea")),
    ],
    go=("go", "go", "goes"),
    went=("went", "went", "went"),
    places=["to school", "to the market", "to the river", "to the field", "to the office", "to the village",
            "to the hospital", "to the distant town", "to the festival"],
    cities=["Dhaka", "Kolkata", "Chittagong", "Sylhet", "Khulna"],
    times=["at dawn", "in the morning", "at noon", "in the afternoon", "in the evening", "at night"],
    sightings=[
        ("in the garden", ("flowers", "birds", "trees")),
        ("on the river", ("boats", "fish")),
        ("in the sky", ("birds", "clouds")),
        ("in the field", ("cows", "boys")),
    ],
    moods=["happy", "tired", "calm", "sad"],
)

LANGUAGES = {"bn": _BENGALI, "en": _ENGLISH}
MIN_DOCUMENT, MAX_DOCUMENT = 3, 8


def _document(rng: random.Random, language: _Language, length: int) -> list[str]:
    subject, person = rng.choice(language.subjects)
    # The intro and outro are optional unless the times of day alone cannot fill `length`.
    n_times = len(language.times)
    intro = length >= 3 and (rng.random() < 0.3 or length > n_times + 1)
    outro = length - intro >= 2 and (rng.random() < 0.5 or length - intro > n_times)
    n_timed = length - intro - outro
    sentences = []
    if intro:
        year = language.number(rng, rng.randint(1990, 2023))
        sentences.append(language.trip(subject, person, rng.choice(language.cities), year))
    for time in sorted(rng.sample(range(len(language.times)), n_timed)):
        sentences.append(_timed_sentence(rng, language, subject, person, language.times[time]))
    if outro:
        sentences.append(language.mood(subject, person, rng.choice(language.moods)))
    return sentences


def _timed_sentence(rng: random.Random, language: _Language, subject: str, person: int, time: str) -> str:
    kind = rng.choices(("activity", "question", "going", "sighting"), weights=(5, 1, 2, 2))[0]
    if kind == "going":
        return language.going(subject, person, rng.choice(language.places), time)
    if kind == "sighting":
        place, things = rng.choice(language.sightings)
        return language.sighting(time, place, language.number(rng, rng.randint(2, 12)), rng.choice(things))
    verb, objects = rng.choice(language.actions)
    sentence = language.question if kind == "question" else language.activity
    return sentence(subject, person, verb, rng.choice(objects), time)


def _documents(*, n_lines: int, seed: int, languages: Sequence[str]) -> Iterator[list[str]]:
    unknown = set(languages) - LANGUAGES.keys()
    if unknown or not languages:
        raise ValueError(f"corpus languages must be among {sorted(LANGUAGES)}, got {list(languages)}")
    rng = random.Random(seed)
    remaining, index = n_lines, 0
    while remaining > 0:
        length = rng.randint(MIN_DOCUMENT, MAX_DOCUMENT)
        # Size the last documents so that none ends up shorter than MIN_DOCUMENT.
        if remaining <= MAX_DOCUMENT:
            length = remaining
        elif remaining - length < MIN_DOCUMENT:
            length = remaining - MIN_DOCUMENT
        language = LANGUAGES[languages[index % len(languages)]]
        yield _document(rng, language, length)
        remaining -= length
        index += 1


def corpus_lines(*, n_lines: int, seed: int = 0, languages: Sequence[str] = ("bn", "en")) -> list[str]:
    """`n_lines` synthetic sentences, the same for the same seed; documents alternate between `languages`."""
    return [line for document in _documents(n_lines=n_lines, seed=seed, languages=languages) for line in document]


def corpus_write(path: str | Path, *, n_lines: int, seed: int = 0, languages: Sequence[str] = ("bn", "en")) -> Path:
    """Write the `corpus_lines` sentences to `path` (UTF-8, one per line) with a blank line between documents."""
    path = Path(path)
    documents = _documents(n_lines=n_lines, seed=seed, languages=languages)
    path.write_text("\n\n".join("\n".join(document) for document in documents) + "\n", encoding="utf-8")
    return path
