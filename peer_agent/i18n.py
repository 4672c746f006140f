"""The agent's messages in the volunteer's language: GNU gettext catalogs in peer_agent/locale/
(`make messages` gathers and compiles them), chosen as gettext does by LANGUAGE, LC_ALL,
LC_MESSAGES or LANG, e.g. ``LANGUAGE=bn peer-agent status``. Without a catalog, English."""

import gettext
from pathlib import Path

LOCALE_DIR = Path(__file__).with_name("locale")


def _translation() -> gettext.NullTranslations:
    # Looked up on each call, so that the environment of the moment decides; gettext caches the files.
    return gettext.translation("peer_agent", localedir=LOCALE_DIR, fallback=True)


def _(message: str) -> str:
    return _translation().gettext(message)


def ngettext(singular: str, plural: str, n: int) -> str:
    return _translation().ngettext(singular, plural, n)
