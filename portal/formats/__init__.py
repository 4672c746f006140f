"""Number formats per language (Django's FORMAT_MODULE_PATH), and the reader's digits: the languages
whose CLDR default numbering system is not Latin write their own (Bengali: ০–৯)."""

from django.utils import formats, translation

NATIVE_DIGITS = {"bn": str.maketrans("0123456789", "০১২৩৪৫৬৭৮৯")}


def digits_localize(text: str) -> str:
    """``text`` with its digits in the active language's own."""
    table = NATIVE_DIGITS.get(translation.get_language() or "")
    return text.translate(table) if table else text


def number_localize(value, decimals: int = 0) -> str:
    """``value`` rounded to ``decimals`` places, grouped by thousands, in the reader's digits."""
    if value is None or value == "":
        return "—"
    shown = formats.number_format(round(float(value), decimals), decimal_pos=decimals, force_grouping=True)
    return digits_localize(shown)
