import pytest

from runs.setup.corpus import MAX_DOCUMENT, MIN_DOCUMENT, corpus_lines, corpus_write

ENGLISH_TIMES = ["at dawn", "in the morning", "at noon", "in the afternoon", "in the evening", "at night"]


def is_bengali(line: str) -> bool:
    return any("\u0980" <= c <= "\u09ff" for c in line)


def read_documents(path) -> list[list[str]]:
    return [document.splitlines() for document in path.read_text(encoding="utf-8").strip("\n").split("\n\n")]


def test_the_same_seed_gives_the_same_lines_and_another_seed_other_lines():
    assert corpus_lines(n_lines=300, seed=3) == corpus_lines(n_lines=300, seed=3)
    assert corpus_lines(n_lines=300, seed=3) != corpus_lines(n_lines=300, seed=4)


@pytest.mark.parametrize("n_lines", [0, 1, 2, 3, 8, 9, 10, 11, 257])
def test_exactly_the_requested_number_of_lines(n_lines):
    assert len(corpus_lines(n_lines=n_lines)) == n_lines


def test_about_half_the_lines_are_bengali_and_half_english():
    lines = corpus_lines(n_lines=1000)
    bengali = [line for line in lines if is_bengali(line)]
    english = [line for line in lines if line.isascii()]
    assert len(bengali) + len(english) == len(lines)
    assert 0.35 < len(bengali) / len(lines) < 0.65


def test_bengali_lines_cover_vowel_signs_conjuncts_danda_and_both_kinds_of_digits():
    text = "".join(line for line in corpus_lines(n_lines=2000) if is_bengali(line))
    assert set("ািীুূৃেৈোৌ্ঁংঃয়ৎ।") <= set(text)
    assert set("০১২৩৪৫৬৭৮৯") & set(text) and set("0123456789") & set(text)


def test_sentences_end_with_a_danda_full_stop_or_question_mark():
    for line in corpus_lines(n_lines=500):
        assert line[-1] in ("।?" if is_bengali(line) else ".?"), line


def test_languages_can_be_restricted_and_must_be_known():
    assert all(line.isascii() for line in corpus_lines(n_lines=100, languages=("en",)))
    with pytest.raises(ValueError, match="must be among"):
        corpus_lines(n_lines=10, languages=("fr",))


def test_written_corpus_has_blank_lines_between_documents_of_three_to_eight_sentences(tmp_path):
    path = corpus_write(tmp_path / "corpus.txt", n_lines=400, seed=7)
    documents = read_documents(path)
    assert len(documents) > 1
    for document in documents:
        assert MIN_DOCUMENT <= len(document) <= MAX_DOCUMENT
        assert all(document), "no blank line inside a document"
        assert len({is_bengali(line) for line in document}) == 1, "one language per document"
    assert [line for document in documents for line in document] == corpus_lines(n_lines=400, seed=7)


def test_times_of_day_follow_each_other_within_a_document_so_sentence_order_is_learnable(tmp_path):
    for document in read_documents(corpus_write(tmp_path / "corpus.txt", n_lines=400)):
        times = [ENGLISH_TIMES.index(t) for line in document for t in ENGLISH_TIMES if t in line.lower()]
        assert times == sorted(times), document
