"""The run's tokenizer: a SentencePiece-style Unigram LM trained with `tokenizers`, sahajBERT's recipe.

Normalization keeps everything Bengali needs (vowel signs, hasanta, ZWJ/ZWNJ) and only folds
variants that mean the same thing, so the vocabulary is not spent on typographic noise.
Plain functions, no Django: the portal calls them from a Celery task and a management command.
"""

from __future__ import annotations

import itertools
import json
import logging
from collections import Counter
from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from peer_agent.protocol import CLS, SEP, SPECIAL_TOKENS, UNK

logger = logging.getLogger(__name__)

MIN_VOCAB_SIZE = 100
METASPACE = "▁"

_INDIC = "\u0900-\u09ff"  # Devanagari and Bengali blocks
_ZWNJ, _ZWJ = "\u200c", "\u200d"
# Private-use stand-ins: Nmt turns U+200B..U+200F into spaces, which would split Bengali
# conjuncts such as র‍্য (ra + ZWJ + hasanta + ya), so ZWJ/ZWNJ hide behind these meanwhile.
_ZWNJ_HELD, _ZWJ_HELD = "\ue000", "\ue001"

# Variants that recur in scraped text and carry no meaning of their own.
_VARIANTS = [
    (Regex("[\u201c\u201d\u201e\u201f\u00ab\u00bb\u2033]"), '"'),  # “ ” „ ‟ « » ″
    (Regex("[\u2018\u2019\u201a\u201b\u2032]"), "'"),  # ‘ ’ ‚ ‛ ′
    (Regex("[\u2010\u2012\u2013\u2014\u2015\u2212]"), "-"),  # hyphen, figure/en/em dash, bar, minus
    # Danda look-alikes: the unassigned Bengali danda slots, the currency numerator four, and a
    # pipe typed after Bengali text; the real dandas are the shared Devanagari U+0964/U+0965.
    ("\u09e4", "\u0964"),
    ("\u09e5", "\u0965"),
    ("\u09f7", "\u0964"),
    (Regex(f"(?<=[{_INDIC}]|[{_INDIC}] )\\|"), "\u0964"),
    # A colon typed for the visarga inside a word (দু:খ → দুঃখ); a colon after a word stays a colon.
    (Regex("(?<=[\u0980-\u09ff]):(?=[\u0980-\u09ff])"), "\u0983"),
    # Pre-Unicode-4.1 khanda ta (ত + hasanta + ZWJ) and the atomic ৎ are the same letter.
    ("\u09a4\u09cd\u200d", "\u09ce"),
]


def _normalizer(*, lowercase: bool, strip_accents: bool) -> normalizers.Normalizer:
    steps = [
        normalizers.Replace(Regex(f"(?<=[{_INDIC}]){_ZWNJ}"), _ZWNJ_HELD),
        normalizers.Replace(Regex(f"(?<=[{_INDIC}]){_ZWJ}"), _ZWJ_HELD),
        normalizers.Nmt(),
        normalizers.NFKC(),  # also folds no-break, thin and other spaces into " "
        normalizers.Replace(_ZWNJ_HELD, _ZWNJ),
        normalizers.Replace(_ZWJ_HELD, _ZWJ),
        *(normalizers.Replace(pattern, content) for pattern, content in _VARIANTS),
        normalizers.Replace(Regex(" {2,}"), " "),
    ]
    if lowercase:
        steps.append(normalizers.Lowercase())
    if strip_accents:
        # StripAccents removes non-spacing marks, which includes Bengali ি ু ূ ৃ ্ ঁ: opt-in only.
        steps += [normalizers.NFD(), normalizers.StripAccents()]
    return normalizers.Sequence(steps)


def tokenizer_build(*, lowercase: bool = False, strip_accents: bool = False) -> Tokenizer:
    """Return an untrained Unigram tokenizer with sahajBERT's normalization and pre-tokenization.

    Metaspace runs first so that word starts are marked on whitespace only; punctuation and
    digits split afterwards carry no `▁`, which keeps decoding lossless ("হ্যাঁ, ২০" stays so).
    """
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.normalizer = _normalizer(lowercase=lowercase, strip_accents=strip_accents)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Metaspace(replacement=METASPACE, prepend_scheme="always"),
            pre_tokenizers.Punctuation(),
            pre_tokenizers.Digits(individual_digits=True),
        ]
    )
    tokenizer.decoder = decoders.Metaspace(replacement=METASPACE, prepend_scheme="always")
    cls_id, sep_id = SPECIAL_TOKENS.index(CLS), SPECIAL_TOKENS.index(SEP)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{CLS} $A {SEP}",
        pair=f"{CLS} $A {SEP} $B:1 {SEP}:1",
        special_tokens=[(CLS, cls_id), (SEP, sep_id)],
    )
    return tokenizer


def tokenizer_train(
    *, lines: Iterable[str], vocab_size: int, lowercase: bool = False, strip_accents: bool = False
) -> Tokenizer:
    """Train a Unigram LM tokenizer on `lines`; special tokens get ids 0..4.

    `vocab_size` is an upper bound: a corpus with fewer useful pieces than that yields a smaller
    vocabulary (the trainer cannot invent pieces), so read the size back with `get_vocab_size()`.
    """
    tokenizer = tokenizer_build(lowercase=lowercase, strip_accents=strip_accents)
    trainer = trainers.UnigramTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, unk_token=UNK, show_progress=False
    )
    lines = list(lines)
    tokenizer.train_from_iterator(itertools.chain(lines, _whole_word_seeds(tokenizer, lines)), trainer=trainer)
    return _vocab_canonical(tokenizer)


def _whole_word_seeds(tokenizer: Tokenizer, lines: list[str]) -> list[str]:
    """Extra training lines that make every word seen at least twice a candidate piece.

    The trainer's candidate pieces (tokenizers 0.23, `UnigramTrainer`) are the substrings found in at
    least two *distinct* words, whatever each word's count: a word that is no part of another word
    is never a candidate, however frequent. Natural text hides most words inside longer ones, but a
    corpus of a few hundred distinct words (the generated demo corpus) came out at ~420 pieces for
    4,000 asked, its names split into letters (``▁ N a s r i n``), so a small model had to learn
    words from letters. SentencePiece, whose recipe this follows, takes every substring seen twice in
    the corpus. One line of each such word written twice over (``NasrinNasrin``) is a distinct word
    that contains it: the word becomes a candidate, and a word seen once more barely moves the counts
    the trainer then prunes by.
    """
    counts: Counter[str] = Counter()
    for line in lines:
        pieces = tokenizer.pre_tokenizer.pre_tokenize_str(tokenizer.normalizer.normalize_str(line))
        counts.update(piece for piece, _ in pieces)
    words = (piece.removeprefix(METASPACE) for piece, count in counts.items() if count >= 2)
    return [word + word for word in words if len(word) >= 2]


# The trainer gives each character that pruning dropped a made-up score, the lowest score plus k times
# this step, with k in the order of a hash set (tokenizers 0.23, `UnigramTrainer::finalize`).
_DROPPED_CHARACTER_STEP = 1e-4


def _vocab_canonical(tokenizer: Tokenizer) -> Tokenizer:
    """The trained pieces in one order for the same text, whatever order the trainer happened to use.

    Two things moved from one training to the next, and with them token ids, so that the same run id
    gave different initial weights (docs/benchmarks.md section 15): the order of pieces whose scores
    tie up to float noise (1e-14), and which dropped character got which made-up score. The made-up
    scores are handed out again in the characters' order.
    """
    parsed = json.loads(tokenizer.to_str())
    specials, pieces = parsed["model"]["vocab"][:len(SPECIAL_TOKENS)], parsed["model"]["vocab"][len(SPECIAL_TOKENS):]
    lowest = min(score for _, score in pieces)

    def made_up(piece: str, score: float) -> bool:
        steps = (score - lowest) / _DROPPED_CHARACTER_STEP
        return len(piece) == 1 and abs(steps - round(steps)) < 1e-6

    dropped = {piece: score for piece, score in pieces if made_up(piece, score)}
    rescored = dict(zip(sorted(dropped), sorted(dropped.values(), reverse=True), strict=True))
    pieces = [[piece, rescored.get(piece, score)] for piece, score in pieces]
    parsed["model"]["vocab"] = specials + sorted(pieces, key=lambda piece: (-round(piece[1], 8), piece[0]))
    return Tokenizer.from_str(json.dumps(parsed))


def tokenizer_validate(json_text: str) -> Tokenizer:
    """Load an uploaded `tokenizer.json`, or raise `ValueError` with a sentence an organizer can act on."""
    hint = "Upload the tokenizer.json written by tokenizers' Tokenizer.save(), or let the portal train one."
    try:
        parsed = json.loads(json_text)
    except RecursionError:  # json.loads recurses once per level of nesting
        raise ValueError(f"The uploaded JSON is nested too deeply to be a tokenizer. {hint}") from None
    except ValueError as error:
        logger.info("uploaded tokenizer is not JSON: %s", error)
        raise ValueError(f"The uploaded file is not valid JSON. {hint}") from None
    if not isinstance(parsed, dict) or "model" not in parsed:
        raise ValueError(f"The uploaded JSON is not a tokenizer: it has no model. {hint}")
    try:
        tokenizer = Tokenizer.from_str(json_text)
    except Exception as error:  # the Rust side raises a bare Exception for any schema mismatch
        logger.info("uploaded tokenizer does not load: %s", error)
        raise ValueError(f"The uploaded JSON is not a tokenizer the tokenizers library can load. {hint}") from None
    missing = [token for token in SPECIAL_TOKENS if tokenizer.token_to_id(token) is None]
    if missing:
        raise ValueError(
            f"The tokenizer is missing the special tokens {', '.join(missing)}; ALBERT pretraining needs "
            f"{', '.join(SPECIAL_TOKENS)}. Pass them as special_tokens when training it, then upload it again."
        )
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    if size < MIN_VOCAB_SIZE:
        raise ValueError(
            f"The tokenizer has {size} tokens; a run needs at least {MIN_VOCAB_SIZE}. "
            "Train it on more text or with a larger vocab_size."
        )
    return tokenizer


def tokenizer_try(tokenizer: Tokenizer, text: str) -> list[str]:
    """Tokens of `text` as the model will see them, without [CLS]/[SEP]."""
    return tokenizer.encode(text, add_special_tokens=False).tokens
