"""The Bengali translation is complete and compiled: every string marked in the portal's templates,
Python and JavaScript, and in the agent's CLI, has a Bengali translation, and the committed .mo files
are what their .po files compile to (a clean clone needs no GNU gettext to run)."""

import shutil
import subprocess
import sys
from pathlib import Path

import polib
import pytest

ROOT = Path(__file__).resolve().parents[2]
CATALOGS = sorted([*ROOT.glob("locale/*/LC_MESSAGES/*.po"), *ROOT.glob("peer_agent/locale/*/LC_MESSAGES/*.po")])
# What `make messages` reads and writes.
SOURCES = ["Makefile", "manage.py", "portal", "accounts", "runs", "templates", "static/js", "locale", "peer_agent"]


def test_there_are_bengali_catalogs_for_the_portal_its_javascript_and_the_agent():
    assert {path.relative_to(ROOT).as_posix() for path in CATALOGS} == {
        "locale/bn/LC_MESSAGES/django.po", "locale/bn/LC_MESSAGES/djangojs.po",
        "peer_agent/locale/bn/LC_MESSAGES/peer_agent.po",
    }


def test_every_marked_string_has_a_bengali_translation(tmp_path):
    """`make messages` on a copy of the sources: a string marked since the catalogs were last
    gathered appears untranslated (or fuzzy, guessed by msgmerge) and fails here, named."""
    for program in ("xgettext", "msgmerge", "msgfmt"):
        assert shutil.which(program), f"{program} is missing: install GNU gettext (Debian: apt-get install gettext)"
    copy = tmp_path / "src"
    for source in SOURCES:
        if (ROOT / source).is_dir():
            shutil.copytree(ROOT / source, copy / source, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (copy / source).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / source, copy / source)
    # -o install: use this interpreter rather than building a virtualenv in the copy.
    subprocess.run(["make", "-s", "-o", "install", "messages", f"PY={sys.executable}"], cwd=copy, check=True,
                   capture_output=True, text=True)
    lacking = {}
    for catalog in CATALOGS:
        po = polib.pofile(str(copy / catalog.relative_to(ROOT)))
        missing = [entry.msgid for entry in po.untranslated_entries() + po.fuzzy_entries()]
        if missing:
            lacking[catalog.name] = missing
    assert not lacking, f"marked strings without a Bengali translation (run `make messages` and translate them): {lacking}"


@pytest.mark.parametrize("catalog", CATALOGS, ids=lambda path: path.name)
def test_the_committed_mo_file_is_its_po_file_compiled(catalog):
    po, mo = polib.pofile(str(catalog)), polib.mofile(str(catalog.with_suffix(".mo")))
    compiled = {(entry.msgid, entry.msgstr, tuple(sorted(entry.msgstr_plural.items()))) for entry in mo if entry.msgid}
    translated = {(entry.msgid, entry.msgstr, tuple(sorted(entry.msgstr_plural.items())))
                  for entry in po.translated_entries()}
    assert compiled == translated, f"{catalog.with_suffix('.mo').name} is stale: run `make messages`"
