"""Numbers and times as the reader reads them: `{{ value|number }}` groups digits and writes them in
the language's own digits (Bengali: ০–৯); `{{ moment|when }}` is a `<time>` that static/js/times.js
rewrites in the reader's time zone and locale, so every board shows times the same way;
`{{ moment|since }}` is how long ago it was, in the reader's words and digits."""

import datetime

from django import template
from django.utils import timezone
from django.utils.html import format_html
from django.utils.timesince import timesince
from django.utils.translation import ngettext_lazy

from portal.formats import digits_localize, number_localize

register = template.Library()

# Django's own words for `timesince`, marked here so that our catalog carries them: Django's Bengali
# catalog lacks them.
TIME_STRINGS = {
    "year": ngettext_lazy("%(num)d year", "%(num)d years", "num"),
    "month": ngettext_lazy("%(num)d month", "%(num)d months", "num"),
    "week": ngettext_lazy("%(num)d week", "%(num)d weeks", "num"),
    "day": ngettext_lazy("%(num)d day", "%(num)d days", "num"),
    "hour": ngettext_lazy("%(num)d hour", "%(num)d hours", "num"),
    "minute": ngettext_lazy("%(num)d minute", "%(num)d minutes", "num"),
}


@register.filter
def number(value, decimals: int = 0) -> str:
    """``value`` rounded to ``decimals`` places, grouped by thousands, in the reader's digits."""
    return number_localize(value, decimals)


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


@register.filter
def since(moment: datetime.datetime | None) -> str:
    """How long ago ``moment`` was ("3 minutes"), in the reader's language and digits."""
    if not moment:
        return "—"
    return digits_localize(timesince(moment, time_strings=TIME_STRINGS))


@register.filter
def digits(value) -> str:
    """``value`` as Python writes it (a rate, 0.00176), in the reader's digits."""
    return digits_localize(str(value))
