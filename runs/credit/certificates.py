"""Contribution certificates: what a certificate says, recomputed from the board each time it is
shown (a stored certificate holds only who, which run and a random code), and its SVG and PNG.

The PNG is drawn with Pillow: text is split into Bengali and other runs, each drawn with a font that
has its glyphs (Lohit Bengali, Noto Sans Bengali; DejaVu Sans for the rest), shaped by libraqm
when Pillow has it (Bengali conjuncts need it). Without a Bengali font the PNG still renders and
the log says which package to install."""

import datetime
import functools
import io
import logging
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.db.models import Count, Q
from django.template.loader import render_to_string
from django.utils import timezone, translation
from django.utils.translation import gettext as _

from accounts.models import User
from portal.formats import digits_localize, number_localize
from runs.models import Certificate, Run, RunCredit

logger = logging.getLogger(__name__)
WIDTH, HEIGHT = 1200, 850
BENGALI = range(0x0980, 0x0A00)
JOINERS = {"\u200c", "\u200d"}  # zero-width (non-)joiners belong to the Bengali run around them
FONT_FILES = {
    "bengali": ("Lohit-Bengali.ttf", "NotoSansBengali-Regular.ttf", "NotoSerifBengali-Regular.ttf"),
    "latin": ("DejaVuSans.ttf", "NotoSans-Regular.ttf", "LiberationSans-Regular.ttf"),
}


@dataclass(frozen=True)
class CertificateFacts:
    """What a certificate states, as the board shows it now."""

    code: str
    name: str
    run_name: str
    run_slug: str
    model: str
    credit: float
    samples: int
    rank: int
    volunteers: int
    as_of: datetime.date
    issued_at: datetime.datetime


def certificate_for(*, user: User, run: Run) -> Certificate | None:
    """The volunteer's certificate for the run, made on first request; None while they have no
    confirmed credit there (a certificate states confirmed work only)."""
    if not RunCredit.objects.filter(run=run, user=user, credit__gt=0).exists():
        return None
    certificate, _ = Certificate.objects.get_or_create(run=run, user=user)
    return certificate


def certificate_name(user: User) -> str:
    """The name as the volunteer chose to appear: their display name, username or pseudonym; a
    hidden volunteer's certificate is theirs alone and bears their display name or username."""
    return user.public_name or user.display_name or user.username


def board_rank(*, run: Run, user: User) -> tuple[int, int]:
    """The volunteer's rank on the run's board (all time, by confirmed credit, ties by who came
    first, as runs/credit/boards.py orders it) and how many volunteers the board ranks. Hidden
    volunteers are off the board: a hidden volunteer is ranked as if they were on it."""
    total = RunCredit.objects.filter(run=run, user=user).first() or RunCredit(run=run, user=user)
    board = RunCredit.objects.filter(run=run, samples_verified__gt=0).exclude(user__visibility=User.Visibility.HIDDEN)
    ahead = Q(credit__gt=total.credit) | Q(credit=total.credit, user_id__lt=user.pk)
    counts = board.aggregate(ahead=Count("pk", filter=ahead), ranked=Count("pk"))
    hidden = user.visibility == User.Visibility.HIDDEN
    return counts["ahead"] + 1, counts["ranked"] + (1 if hidden else 0)


def certificate_facts(certificate: Certificate) -> CertificateFacts:
    """The certificate's statements recomputed from the run's totals now."""
    run, user = certificate.run, certificate.user
    # A rebuild may have removed the totals since (work all rejected): the certificate then states none.
    total = RunCredit.objects.filter(run=run, user=user).first() or RunCredit(run=run, user=user)
    rank, volunteers = board_rank(run=run, user=user)
    preset = run.configuration.model.preset
    return CertificateFacts(
        code=certificate.code, name=certificate_name(user), run_name=run.name, run_slug=run.slug,
        model=f"ALBERT ({preset})", credit=total.credit, samples=total.samples_verified, rank=rank,
        volunteers=volunteers, as_of=timezone.localdate(), issued_at=certificate.issued_at,
    )


def certificate_lines(facts: CertificateFacts, verify_url: str) -> list[tuple[str, int]]:
    """The certificate's text, line by line, with each line's size in pixels: the SVG and the PNG
    say the same words."""
    return [
        (_("Certificate of contribution"), 44),
        (facts.name, 64),
        (_("contributed %(credit)s GFLOP of confirmed training compute") % {"credit": number_localize(facts.credit)}, 30),
        (_("to %(run)s, training %(model)s") % {"run": facts.run_name, "model": facts.model}, 30),
        (_("rank %(rank)s of %(volunteers)s volunteers · %(samples)s confirmed samples")
         % {"rank": number_localize(facts.rank), "volunteers": number_localize(facts.volunteers),
            "samples": number_localize(facts.samples)}, 26),
        (_("as of %(date)s") % {"date": digits_localize(facts.as_of.isoformat())}, 24),
        (_("Verify: %(url)s") % {"url": verify_url}, 20),
    ]


def certificate_svg(facts: CertificateFacts, verify_url: str) -> str:
    lines = certificate_lines(facts, verify_url)
    return render_to_string("runs/certificate.svg", {
        "facts": facts, "lines": [(text, size, _line_y(index)) for index, (text, size) in enumerate(lines)],
        "width": WIDTH, "height": HEIGHT, "center": WIDTH // 2, "lang": translation.get_language() or "en",
        "verify_url": verify_url,
    })


def _line_y(index: int) -> int:
    return (170, 300, 420, 480, 560, 640, 760)[index]


def certificate_png(facts: CertificateFacts, verify_url: str) -> bytes:
    from PIL import Image, ImageDraw  # Pillow only for a PNG download: a web process serving none never loads it

    image = Image.new("RGB", (WIDTH, HEIGHT), "#fffdf5")
    draw = ImageDraw.Draw(image)
    draw.rectangle((24, 24, WIDTH - 25, HEIGHT - 25), outline="#b45309", width=6)
    draw.rectangle((44, 44, WIDTH - 45, HEIGHT - 45), outline="#1d4ed8", width=2)
    for index, (text, size) in enumerate(certificate_lines(facts, verify_url)):
        _draw_centered(draw, text, size=size, baseline=_line_y(index), fill="#111827" if index != 1 else "#1d4ed8")
    output = io.BytesIO()
    image.save(output, format="PNG", optimize=True)
    return output.getvalue()


def text_runs(text: str) -> list[tuple[str, str]]:
    """``text`` cut into runs of one script each: ("bengali", …) or ("latin", …). Spaces and
    joiners stay with the run they are in."""
    runs: list[tuple[str, str]] = []
    for char in text:
        script = "bengali" if ord(char) in BENGALI else "latin"
        if runs and (char.isspace() or char in JOINERS or runs[-1][0] == script):
            runs[-1] = (runs[-1][0], runs[-1][1] + char)
        else:
            runs.append((script, char))
    return runs


def _draw_centered(draw, text: str, *, size: int, baseline: int, fill: str) -> None:
    # Shrink a line that would not fit (a long name, a long link) until it does.
    while True:
        pieces = [(font_for(script, size), piece) for script, piece in text_runs(text)]
        width = sum(font.getlength(piece) for font, piece in pieces)
        if width <= WIDTH - 120 or size <= 10:
            break
        size -= 2
    x = (WIDTH - width) / 2
    for font, piece in pieces:
        draw.text((x, baseline), piece, font=font, fill=fill, anchor="ls")
        x += font.getlength(piece)


@functools.lru_cache(maxsize=1)
def font_paths() -> dict[str, Path | None]:
    """The font file found for each script under CERTIFICATE_FONT_DIRS, in FONT_FILES' order of preference."""
    found: dict[str, Path | None] = {}
    for script, names in FONT_FILES.items():
        found[script] = None
        for name in names:
            matches = [path for folder in settings.CERTIFICATE_FONT_DIRS
                       for path in sorted(Path(folder).expanduser().rglob(name)) if Path(folder).expanduser().is_dir()]
            if matches:
                found[script] = matches[0]
                break
        if found[script] is None:
            logger.warning("no %s font (%s) under %s: certificates fall back to Pillow's built-in font, which has no "
                           "Bengali glyphs; install fonts-lohit-beng-bengali (Debian) or set CERTIFICATE_FONT_DIRS",
                           script, ", ".join(names), ", ".join(settings.CERTIFICATE_FONT_DIRS))
    return found


@functools.lru_cache(maxsize=64)
def font_for(script: str, size: int):
    from PIL import ImageFont, features  # Pillow: only certificate_png draws text

    path = font_paths()[script] or font_paths()["latin"]
    if path is None:
        return ImageFont.load_default(size)
    engine = ImageFont.Layout.RAQM if features.check("raqm") else ImageFont.Layout.BASIC
    return ImageFont.truetype(str(path), size, layout_engine=engine)


def font_covers(font, char: str) -> bool:
    """Whether ``font`` has a glyph of its own for ``char`` (not the box it draws for any it lacks)."""
    missing = font.getmask("\U0010fffd")
    drawn = font.getmask(char)
    return drawn.getbbox() is not None and (drawn.size != missing.size or bytes(drawn) != bytes(missing))
