"""Every word a template shows is marked for translation: text between tags, the attributes a reader
sees or hears (aria-label, placeholder, title, alt, a button's value) and the questions of `confirm()`
must come from `{% translate %}` or `{% blocktranslate %}`, so that no page slips back into English in
Bengali (docs/translating.md). Code samples (`<code>`), scripts and a few names are left as they are."""

import re
from pathlib import Path

import pytest
from django.template.base import Lexer, TokenType

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = sorted(path for path in (ROOT / "templates").rglob("*") if path.suffix in {".html", ".txt"})

# Names and codes that read the same in every language.
ALLOWED = {"DeDLOC Portal", "API", "JSON", "UTC", "ALBERT", "SVG", "PNG"}
HOLE = "\x00"  # where a variable or a tag was: its words are checked where they come from
# Blocks whose text is marked, or never shown.
SKIPPED_BLOCKS = {"blocktranslate": "endblocktranslate", "blocktrans": "endblocktrans", "comment": "endcomment",
                  "verbatim": "endverbatim"}
UNSHOWN = re.compile(r"<(script|style|code)\b[^>]*>.*?</\1>|<!--.*?-->", re.S | re.I)
HEARD = re.compile(r"""\b(?:aria-label|placeholder|title|alt)\s*=\s*(["'])([^"']*)\1""", re.I)
ASKED = re.compile(r"""\bconfirm\(\s*(["'])((?:(?!\1).)*)\1""")
BUTTON = re.compile(r"""<input\b(?=[^>]*\btype\s*=\s*["']?(?:submit|button|reset)\b)[^>]*\bvalue\s*=\s*(["'])([^"']*)\1""", re.I)
TAG = re.compile(r"<[^>]*>", re.S)
ENTITY = re.compile(r"&#?\w+;")
LETTER = re.compile(r"[^\W\d_]")
PATH = re.compile(r"^/\S*$")  # an address shown as it is, e.g. /api/v1/stats


def skeleton(source: str) -> str:
    """The template's text with every variable and tag a HOLE and marked or unshown blocks dropped."""
    parts, closing = [], None
    for token in Lexer(source).tokenize():
        if closing:
            if token.token_type == TokenType.BLOCK and token.contents.split()[0] == closing:
                closing = None
            continue
        if token.token_type == TokenType.BLOCK and token.contents.split()[0] in SKIPPED_BLOCKS:
            closing = SKIPPED_BLOCKS[token.contents.split()[0]]
            parts.append(HOLE)
        elif token.token_type == TokenType.TEXT:
            parts.append(token.contents)
        elif token.token_type != TokenType.COMMENT:
            parts.append(HOLE)
    return "".join(parts)


def unmarked_text(source: str, *, markup: bool = True) -> list[str]:
    """The words of ``source`` that a reader would get untranslated."""
    text = skeleton(source)
    found = []
    if markup:
        text = UNSHOWN.sub(HOLE, text)
        for pattern in (HEARD, ASKED, BUTTON):
            found += [match.group(2) for match in pattern.finditer(text)]
        text = TAG.sub(HOLE, text)
    found += [fragment for fragment in re.split(HOLE, ENTITY.sub(" ", text))]
    cleaned = [" ".join(fragment.replace(HOLE, " ").split()) for fragment in found]
    return [fragment for fragment in cleaned if LETTER.search(fragment) and not PATH.match(fragment)
            and " ".join(re.sub(r"[^\w\s]", " ", fragment).split()) not in ALLOWED]


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda path: path.relative_to(ROOT / "templates").as_posix())
def test_every_word_a_template_shows_is_marked_for_translation(path):
    assert unmarked_text(path.read_text(), markup=path.suffix == ".html") == []


@pytest.mark.parametrize("source, words", [
    ("<h1>Health of {{ run.name }}</h1>", ["Health of"]),
    ('<input placeholder="usernames" aria-label="{% translate \'Allowlist\' %}">', ["usernames"]),
    ("""<form onsubmit="return confirm('Finish this run?');">""", ["Finish this run?"]),
    ('<input type="submit" value="Save"><input type="hidden" name="next" value="runs">', ["Save"]),
    ("{% block title %}Edit {{ name }}{% endblock %}", ["Edit"]),
    ("<p>{% translate 'Saved' %} <code>python manage.py run_coordinator</code> &middot; API</p>", []),
    ("<p>{% blocktranslate %}Edit {{ name }}{% endblocktranslate %}</p>{# a note #}", []),
    ("<script>const a = 'word';</script><p>{{ a }} — 42% · <a href=\"/api/v1/stats\">/api/v1/stats</a></p>", []),
    ("<title>{% block title %}{% endblock %} · DeDLOC Portal</title><p>Reset your password</p>", ["Reset your password"]),
])
def test_the_check_finds_unmarked_words_and_only_those(source, words):
    assert unmarked_text(source) == words
