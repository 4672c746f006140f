"""Numbers and times as the reader reads them: `{{ value|number }}` groups digits and writes them in
the language's own digits (Bengali: ০–৯); `{{ moment|when }}` is a `<time>` that static/js/times.js
rewrites in the reader's time zone and locale, so every board shows times the same way."""

import datetime

from django import template
from django.utils import formats, timezone, translation
from django.utils.html import format_html

register = template.Library()

# The languages whose CLDR default numbering system is not Latin digits.
NATIVE_DIGITS = {"bn": str.maketrans("0123456789", "০১২৩৪৫৬৭৮৯")}


def digits_localize(text: str) -> str:
    table = NATIVE_DIGITS.get(translation.get_language() or "")
    return text.translate(table) if table else text


@register.filter
def number(value, decimals: int = 0) -> str:
    """``value`` rounded to ``decimals`` places, grouped by thousands, in the reader's digits."""
    if value is None or value == "":
        return "—"
    shown = formats.number_format(round(float(value), decimals), decimal_pos=decimals, force_grouping=True)
    return digits_localize(shown)


@register.filter
def when(moment: datetime.datetime | str | None) -> str:
    """A `<time>` holding ``moment`` (or its ISO text, as live snapshots carry it); its text, in UTC
    until times.js localizes it, reads alike everywhere."""
    if not moment:
        return "—"
    if isinstance(moment, str):
        moment = datetime.datetime.fromisoformat(moment)
    utc = timezone.localtime(moment, datetime.UTC)
    text = digits_localize(utc.strftime("%Y-%m-%d %H:%M")) + " UTC"
    return format_html('<time class="local" datetime="{}">{}</time>', utc.isoformat(), text)
