"""Names that others read on boards: usernames, display names and team names.

A name is refused when it hides characters or looks like a name someone else already holds, so
that no volunteer appears on a board as another. "Looks like" is the confusable skeleton of
Unicode TR39 as ICU computes it (icu.SpoofChecker), the reference implementation of that standard.
"""

import icu
from django.core.exceptions import ValidationError
from django.db.models import Q, QuerySet
from django.utils.translation import gettext_lazy as _

_NFKC = icu.Normalizer2.getNFKCInstance()
_SPOOF_CHECKER = icu.SpoofChecker()
# What a reader cannot see or that reorders what they see: bidi controls, zero-width characters,
# fillers such as U+3164 HANGUL FILLER (Default_Ignorable_Code_Point), controls, private use and
# unassigned code points.
_HIDDEN = icu.UnicodeSet(r"[[:Default_Ignorable_Code_Point:][:Cc:][:Cf:][:Co:][:Cs:][:Cn:]]")
_JOINERS = ("\u200c", "\u200d")
_VIRAMA = 9  # the canonical combining class of a virama, such as Bengali U+09CD (্)


def name_normalize(value: str) -> str:
    """NFKC, with every run of whitespace (non-breaking too) one ASCII space and none at the ends."""
    return " ".join(_NFKC.normalize(value).split())


def name_skeleton(value: str) -> str:
    """The key two names share when they look alike, whatever their case: the skeleton of the
    case-folded name. Folding first means a capital I that passes for an l ("oIga") is not caught."""
    return _SPOOF_CHECKER.getSkeleton(0, value.casefold())


def _joins_a_conjunct(value: str, index: int) -> bool:
    # Bengali and other Indic scripts need ZWNJ/ZWJ beside a virama to choose how a conjunct is
    # drawn (র‍্য); there, and only there, they change what a reader sees rather than hide.
    if value[index] not in _JOINERS:
        return False
    neighbours = value[max(index - 1, 0):index] + value[index + 1:index + 2]
    return any(icu.Char.getCombiningClass(char) == _VIRAMA for char in neighbours)


def name_check_visible(value: str) -> None:
    """Refuse a name with a character a reader cannot see or that reorders the text around it."""
    for index, char in enumerate(value):
        if _HIDDEN.contains(char) and not _joins_a_conjunct(value, index):
            raise ValidationError(
                _("Names cannot contain invisible or text-direction characters such as %(character)s; "
                  "type the name again without it."),
                code="hidden_character", params={"character": f"U+{ord(char):04X}"})


def name_check_distinct(value: str, *, rivals: QuerySet, skeleton_fields: tuple[str, ...]) -> None:
    """Refuse a name that looks like one of `rivals`' names, compared by their stored skeletons."""
    skeleton = name_skeleton(value)
    if rivals.filter(Q.create([(field, skeleton) for field in skeleton_fields], connector=Q.OR)).exists():
        raise ValidationError(
            _("“%(name)s” looks too much like a name someone already uses; choose one that reads differently."),
            code="confusable_name", params={"name": value})


def name_clean(value: str, *, rivals: QuerySet, skeleton_fields: tuple[str, ...]) -> str:
    """The name as it will be stored, or ValidationError: what every form that sets a name calls."""
    name = name_normalize(value)
    name_check_visible(name)
    if name:
        name_check_distinct(name, rivals=rivals, skeleton_fields=skeleton_fields)
    return name
