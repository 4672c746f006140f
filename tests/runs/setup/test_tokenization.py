import json
import unicodedata
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, models

from peer_agent.protocol import SPECIAL_TOKENS
from peer_agent.tokenizer import tokenizer_as_transformers
from runs.setup.corpus import corpus_lines
from runs.setup.tokenization import tokenizer_build, tokenizer_train, tokenizer_try, tokenizer_validate

ZWJ, ZWNJ = "\u200d", "\u200c"
VOWEL_SIGNS = set("ািীুূৃেৈোৌ")
HASANTA = "্"
BENGALI_WORDS = [
    "বাংলা", "কিনি", "নদী", "ফুল", "দূর", "বৃষ্টি", "দেশ", "তৈরি", "বোন", "নৌকা",
    "ব\u09c7\u09beন",  # ো typed as ে + া
    "চাঁদ", "দুঃখ", "হঠাৎ", "যায়", "যা\u09df",  # য় both decomposed and precomposed
    "শিক্ষক", "রবীন্দ্রসংগীত", "চট্টগ্রাম", "সন্ধ্যা",
    f"র{ZWJ}্যাব",  # ra + ZWJ + hasanta + ya: the reph-less "র‍্য" of র‍্যাব
    f"উদ্{ZWNJ}যাপন",  # ZWNJ keeps the hasanta visible instead of forming a conjunct
    "খাই।",
]
BENGALI_SENTENCES = [
    "আমি সকালে ভাত খাই।",
    "রহিম কি বিকেলে দাবা খেলে?",
    "২০২১ সালে শিক্ষক চট্টগ্রামে গিয়েছিল।",
    f"র{ZWJ}্যাব সদস্যরা উদ্{ZWNJ}যাপন করল।",
    "সন্ধ্যায় নদীতে ৩টি নৌকা ছিল, কিন্তু রাতে একটিও নেই।",
]


def marks(text: str) -> Counter:
    """Bengali combining marks (vowel signs, hasanta, ঁ ং ঃ, nukta) counted on the canonical decomposition."""
    return Counter(c for c in unicodedata.normalize("NFD", text) if unicodedata.category(c) in ("Mn", "Mc"))


normalize = tokenizer_build().normalizer.normalize_str


@pytest.fixture(scope="module")
def trained():
    return tokenizer_train(lines=corpus_lines(n_lines=2000), vocab_size=2000)


@pytest.fixture(scope="module")
def trained_on_the_sentences():
    # Unigram maps characters it never saw to [UNK], so the training text includes the sentences.
    return tokenizer_train(lines=corpus_lines(n_lines=300) + BENGALI_SENTENCES, vocab_size=500)


def test_the_bengali_word_list_exercises_every_vowel_sign_and_the_hasanta():
    assert VOWEL_SIGNS | {HASANTA} <= set("".join(BENGALI_WORDS))


@pytest.mark.parametrize("word", BENGALI_WORDS)
def test_normalization_keeps_every_bengali_mark(word):
    normalized = normalize(word)
    assert marks(normalized) == marks(word)
    assert normalized == unicodedata.normalize("NFKC", word)


def test_normalization_keeps_zwj_and_zwnj_inside_bengali_words():
    assert ZWJ in normalize(f"র{ZWJ}্যাব")
    assert ZWNJ in normalize(f"উদ্{ZWNJ}যাপন")


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=[chr(c) for c in range(0x0981, 0x09FB) if unicodedata.category(chr(c)) != "Cn"] + [" "]))
def test_normalization_never_drops_a_bengali_mark(text):
    assert marks(normalize(text)) == marks(text)


def test_repeated_and_unusual_spaces_collapse_to_one():
    assert normalize("আমি   ভাত\u00a0\u00a0খাই\tআজ\n") == "আমি ভাত খাই আজ "


def test_quotes_and_dashes_are_homogenized():
    assert normalize("“হ্যাঁ” ‘no’ „x‟ a–b—c−d") == "\"হ্যাঁ\" 'no' \"x\" a-b-c-d"


def test_danda_lookalikes_become_the_danda():
    assert normalize("খাই\u09e4 খাই\u09f7 খাই | খাই\u09e5") == "খাই। খাই। খাই । খাই॥"


def test_a_pipe_outside_bengali_text_stays_a_pipe():
    assert normalize("a|b | c") == "a|b | c"


def test_a_colon_inside_a_bengali_word_becomes_the_visarga_but_not_after_a_word():
    assert normalize("দু:খ") == "দুঃখ"
    assert normalize("নাম: রহিম") == "নাম: রহিম"


def test_old_style_khanda_ta_becomes_the_atomic_letter():
    assert normalize(f"হঠাত্{ZWJ}") == "হঠাৎ"


def test_case_and_accents_are_kept_unless_asked():
    assert normalize("Café") == "Café"
    assert tokenizer_build(lowercase=True).normalizer.normalize_str("Café") == "café"
    assert tokenizer_build(strip_accents=True).normalizer.normalize_str("Café") == "Cafe"


def test_strip_accents_would_destroy_bengali_vowel_signs_which_is_why_it_is_off_by_default():
    assert "ু" not in tokenizer_build(strip_accents=True).normalizer.normalize_str("ফুল")


def test_pre_tokenization_marks_word_starts_and_isolates_punctuation_and_each_digit():
    pieces = [piece for piece, _ in tokenizer_build().pre_tokenizer.pre_tokenize_str("হ্যাঁ, ২০ টাকা। Pay 42!")]
    assert pieces == ["▁হ্যাঁ", ",", "▁", "২", "০", "▁টাকা", "।", "▁Pay", "▁", "4", "2", "!"]


def test_trained_tokens_never_join_digits_or_punctuation_to_words(trained):
    tokens = tokenizer_try(trained, "২০২১ সালে, 1999 সালে। Hello, world!")
    for token in tokens:
        if any(c.isdigit() or unicodedata.category(c).startswith("P") for c in token):
            assert len(token) == 1, token


@pytest.mark.parametrize("sentence", BENGALI_SENTENCES)
def test_bengali_sentences_round_trip_through_encode_and_decode(trained_on_the_sentences, sentence):
    tokenizer = trained_on_the_sentences
    assert tokenizer.decode(tokenizer.encode(sentence).ids) == normalize(sentence)


def test_training_puts_the_special_tokens_first(trained):
    assert [trained.id_to_token(i) for i in range(5)] == SPECIAL_TOKENS


def test_a_small_corpus_yields_a_vocab_no_larger_than_asked(trained):
    assert 100 <= trained.get_vocab_size() <= 2000


def test_a_word_the_corpus_repeats_is_one_token_even_when_no_other_word_contains_it():
    # The trainer's own candidates are substrings of two distinct words: "Nasrin" and "খায়" are part
    # of no other word here, and used to come out letter by letter.
    lines = [f"{name} {verb} {thing}." for name in ("Nasrin", "Rahim", "সীমা") for verb in ("eats", "খায়")
             for thing in ("rice", "ভাত", "mangoes")] * 20 + ["Zebedee once."]
    tokenizer = tokenizer_train(lines=lines, vocab_size=200)

    for word in ("Nasrin", "Rahim", "সীমা", "eats", "খায়", "mangoes"):
        assert tokenizer_try(tokenizer, word) == [f"▁{normalize(word)}"], word
    assert len(tokenizer_try(tokenizer, "Zebedee")) > 1, "a word seen once is no piece of its own"


def test_the_generated_corpus_trains_whole_words(trained):
    assert tokenizer_try(trained, "Nasrin went to Rangpur.") == ["▁Nasrin", "▁went", "▁to", "▁Rangpur", "."]
    assert tokenizer_try(trained, "আমার বন্ধু সকালে মিষ্টি খায়।") == ["▁আমার", "▁বন্ধু", "▁সকালে", "▁মিষ্টি", "▁খায়", "।"]


def test_try_returns_tokens_without_special_tokens(trained):
    tokens = tokenizer_try(trained, "আমি ভাত খাই।")
    assert tokens and not set(tokens) & set(SPECIAL_TOKENS)
    assert "".join(tokens).replace("▁", " ").strip() == "আমি ভাত খাই।"


def test_encoding_a_pair_adds_cls_and_seps_and_segment_ids(trained):
    encoding = trained.encode("আমি ভাত খাই।", "I eat rice.")
    assert encoding.tokens[0] == "[CLS]" and encoding.tokens[-1] == "[SEP]"
    first_sep = encoding.tokens.index("[SEP]")
    assert encoding.type_ids == [0] * (first_sep + 1) + [1] * (len(encoding.tokens) - first_sep - 1)


def test_transformers_wrapper_knows_the_special_tokens_and_segment_ids(trained):
    hf = tokenizer_as_transformers(trained)
    assert [hf.pad_token_id, hf.unk_token_id, hf.cls_token_id, hf.sep_token_id, hf.mask_token_id] == [0, 1, 2, 3, 4]
    encoded = hf("আমি ভাত খাই।", "I eat rice.")
    ids, types = encoded["input_ids"], encoded["token_type_ids"]
    assert ids[0] == hf.cls_token_id and ids[-1] == hf.sep_token_id and ids.count(hf.sep_token_id) == 2
    assert types[0] == 0 and types[-1] == 1 and sorted(types) == types
    assert hf.convert_tokens_to_ids("[MASK]") == 4


def test_validate_accepts_a_trained_tokenizer(trained):
    assert tokenizer_validate(trained.to_str()).get_vocab_size() == trained.get_vocab_size()


@pytest.mark.parametrize(
    ("upload", "says"),
    [
        ("not json {", "not valid JSON"),
        ("", "not valid JSON"),
        ("[1, 2]", "not a tokenizer"),
        (json.dumps({"model": {"type": "Nope"}}), "not a tokenizer"),
    ],
)
def test_validate_rejects_garbage_with_a_sentence(upload, says):
    with pytest.raises(ValueError, match=says) as error:
        tokenizer_validate(upload)
    assert str(error.value).endswith(".") and "Traceback" not in str(error.value)


def test_validate_rejects_a_tokenizer_without_the_special_tokens():
    plain = Tokenizer(models.WordLevel({f"w{i}": i for i in range(200)}, unk_token="w0"))
    with pytest.raises(ValueError, match=r"missing the special tokens \[PAD\], \[UNK\], \[CLS\], \[SEP\], \[MASK\]"):
        tokenizer_validate(plain.to_str())


def test_validate_rejects_an_untrained_tokenizer_with_an_empty_vocab():
    untrained = tokenizer_build()
    untrained.add_special_tokens(SPECIAL_TOKENS)
    with pytest.raises(ValueError, match="has 6 tokens; a run needs at least 100"):
        tokenizer_validate(untrained.to_str())


def test_the_same_text_trains_the_same_token_ids():
    # The trainer orders pieces whose scores tie to float noise differently on each training; the ids
    # must not move, or a run's seeded initial weights differ per token (docs/benchmarks.md section 15).
    lines = corpus_lines(n_lines=4000)
    vocabularies = [tokenizer_train(lines=lines, vocab_size=400).get_vocab() for _ in range(3)]
    assert vocabularies[0] == vocabularies[1] == vocabularies[2]
    assert [vocabularies[0][token] for token in SPECIAL_TOKENS] == list(range(len(SPECIAL_TOKENS)))
