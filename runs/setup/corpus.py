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

MIN_DOCUMENT, MAX_DOCUMENT = 3, 8


@dataclass(frozen=True)
class _Language:
    templates: dict[str, str]  # one str.format template per kind of sentence
    subjects: Sequence[tuple[str, int]]  # (subject, grammatical person 0/1/2)
    names: Sequence[str]  # the subjects that are people's names (tagged PER in runs/setup/labelled.py)
    actions: Sequence[tuple[Sequence[str], Sequence[str]]]  # (verb per person, objects that fit it)
    per_person: dict[str, Sequence[str]]  # other words that agree with the subject
    places: Sequence[str]
    cities: Sequence[str]
    times: Sequence[str]  # in the order they happen during a day
    sightings: Sequence[tuple[str, Sequence[str]]]  # (place, things seen there)
    moods: Sequence[str]
    digits: str = "0123456789"
    native_digit_share: float = 0.0

    def number(self, rng: random.Random, n: int) -> str:
        if rng.random() < self.native_digit_share:
            return str(n).translate(str.maketrans("0123456789", self.digits))
        return str(n)

    def sentence(self, kind: str, person: int, **fields: str) -> str:
        agreeing = {name: forms[person] for name, forms in self.per_person.items()}
        text = self.templates[kind].format(**agreeing, **fields)
        return text[0].upper() + text[1:]


# Words chosen to cover every vowel sign (া ি ী ু ূ ৃ ে ৈ ো ৌ), conjuncts with hasanta
# (ক্ষ ন্ধ ন্দ্র ট্ট ক্র ষ্ট), য-phala, ঁ ং ঃ ৎ and য় ড়.
_BENGALI = _Language(
    templates={
        "activity": "{subject} {time} {obj} {verb}।",
        "question": "{subject} কি {time} {obj} {verb}?",
        "going": "{subject} {time} {place} {go}।",
        "trip": "{year} সালে {subject} {city} {went}।",
        "sighting": "{time} {place} {n}টি {thing} ছিল।",
        "mood": "দিনের শেষে {subject} খুব {mood}।",
    },
    subjects=[
        ("আমি", 0), ("তুমি", 1), ("সে", 2), ("রহিম", 2), ("সীমা", 2), ("কৃষক", 2), ("শিক্ষক", 2),
        ("আমার বন্ধু", 2), ("বৃদ্ধ লোকটি", 2), ("ছোট মেয়েটি", 2), ("নৌকার মাঝি", 2),
        ("করিম", 2), ("নাসরিন", 2), ("ফরিদা", 2), ("আনোয়ার", 2), ("জামাল", 2), ("রিনা", 2),
    ],
    names=["রহিম", "সীমা", "করিম", "নাসরিন", "ফরিদা", "আনোয়ার", "জামাল", "রিনা"],
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
    per_person={"go": ("যাই", "যাও", "যায়"), "went": ("গিয়েছিলাম", "গিয়েছিলে", "গিয়েছিল")},
    places=["স্কুলে", "বাজারে", "নদীর ধারে", "মাঠে", "অফিসে", "গ্রামে", "হাসপাতালে", "দূরের শহরে", "উৎসবে"],
    cities=["ঢাকায়", "কলকাতায়", "চট্টগ্রামে", "সিলেটে", "খুলনায়", "রাজশাহীতে", "বরিশালে", "কুমিল্লায়", "রংপুরে"],
    times=["ভোরে", "সকালে", "দুপুরে", "বিকেলে", "সন্ধ্যায়", "রাতে"],
    sightings=[
        ("বাগানে", ("ফুল", "পাখি", "গাছ")),
        ("নদীতে", ("নৌকা", "মাছ")),
        ("আকাশে", ("পাখি", "মেঘ")),
        ("মাঠে", ("গরু", "ছেলে")),
    ],
    moods=["খুশি", "ক্লান্ত", "শান্ত", "দুঃখী"],
    # Most Bengali text writes Bengali digits; some mixes in ASCII ones.
    digits="০১২৩৪৫৬৭৮৯",
    native_digit_share=0.7,
)

_ENGLISH = _Language(
    templates={
        "activity": "{subject} {verb} {obj} {time}.",
        "question": "{do} {subject} {base} {obj} {time}?",
        "going": "{subject} {go} {place} {time}.",
        "trip": "In {year}, {subject} {went} to {city}.",
        "sighting": "{time}, there were {n} {thing} {place}.",
        "mood": "At the end of the day, {subject} {be} very {mood}.",
    },
    subjects=[
        ("I", 0), ("you", 1), ("he", 2), ("she", 2), ("Rahim", 2), ("Sima", 2), ("the farmer", 2),
        ("the teacher", 2), ("my friend", 2), ("the old man", 2), ("the little girl", 2), ("the boatman", 2),
        ("Karim", 2), ("Nasrin", 2), ("Farida", 2), ("Anwar", 2), ("Jamal", 2), ("Rina", 2),
    ],
    names=["Rahim", "Sima", "Karim", "Nasrin", "Farida", "Anwar", "Jamal", "Rina"],
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
    per_person={
        "go": ("go", "go", "goes"),
        "went": ("went", "went", "went"),
        "do": ("Do", "Do", "Does"),
        "be": ("am", "are", "is"),
    },
    places=[
        "to school", "to the market", "to the river", "to the field", "to the office", "to the village",
        "to the hospital", "to the distant town", "to the festival",
    ],
    cities=["Dhaka", "Kolkata", "Chittagong", "Sylhet", "Khulna", "Rajshahi", "Barisal", "Comilla", "Rangpur"],
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


def _document(rng: random.Random, language: _Language, length: int) -> list[str]:
    subject, person = rng.choice(language.subjects)
    # The trip and the mood are optional unless the times of day alone cannot fill `length`.
    n_times = len(language.times)
    trip = length >= 3 and (rng.random() < 0.3 or length > n_times + 1)
    mood = length - trip >= 2 and (rng.random() < 0.5 or length - trip > n_times)
    sentences = []
    if trip:
        year = language.number(rng, rng.randint(1990, 2023))
        sentences.append(language.sentence("trip", person, subject=subject, city=rng.choice(language.cities), year=year))
    for time in sorted(rng.sample(range(n_times), length - trip - mood)):
        sentences.append(_timed_sentence(rng, language, subject, person, language.times[time]))
    if mood:
        sentences.append(language.sentence("mood", person, subject=subject, mood=rng.choice(language.moods)))
    return sentences


def _timed_sentence(rng: random.Random, language: _Language, subject: str, person: int, time: str) -> str:
    kind = rng.choices(("activity", "question", "going", "sighting"), weights=(5, 1, 2, 2))[0]
    if kind == "going":
        return language.sentence(kind, person, subject=subject, time=time, place=rng.choice(language.places))
    if kind == "sighting":
        place, things = rng.choice(language.sightings)
        n = language.number(rng, rng.randint(2, 12))
        return language.sentence(kind, person, time=time, place=place, n=n, thing=rng.choice(things))
    verbs, objects = rng.choice(language.actions)
    return language.sentence(
        kind, person, subject=subject, time=time, obj=rng.choice(objects), verb=verbs[person], base=verbs[0]
    )


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
        yield _document(rng, LANGUAGES[languages[index % len(languages)]], length)
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
