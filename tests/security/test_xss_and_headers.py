"""Names people choose (run name and description, team name, display name, token name) render
escaped on every page that shows them; the live leaderboard writes text, never HTML; every
response carries the browser-hardening headers."""

import re
from pathlib import Path

import pytest
from django.conf import settings
from django.test import Client
from django.utils import timezone

from accounts.models import Team
from accounts.services import token_create
from runs.models import ContributionEvent, Run
from runs.setup.services import run_ban

SCRIPT = "<script>alert(1)</script>"
IMG = '"><img src=x onerror=alert(1)>'
PAYLOAD = IMG + SCRIPT  # 55 characters: fits every name field
ESCAPED_SCRIPT = "&lt;script&gt;alert(1)&lt;/script&gt;"


@pytest.fixture
def hostile(world):
    """Every free-text name in the world holds the payload, and vik has contributed to the run."""
    run = Run.objects.get(slug=world.values["public"])
    Run.objects.filter(pk=run.pk).update(name=PAYLOAD, description=f"{PAYLOAD}\n{PAYLOAD}")
    vik = world.users["vik"]
    vik.display_name = PAYLOAD
    vik.save(update_fields=["display_name"])
    Team.objects.filter(slug=world.values["team"]).update(name=PAYLOAD)  # vik's team
    token, _ = token_create(user=vik, name=PAYLOAD, run=run)
    session = run.sessions.get(user=vik)
    session.token = token
    session.save(update_fields=["token"])
    ContributionEvent.objects.create(
        session=session, seq=1, samples=64, steps=1, local_epoch=0, samples_per_second=3.0, sent_at=timezone.now()
    )
    run_ban(run=run, actor=world.users["olga"], user=world.users["oscar"], reason=PAYLOAD)
    return world.values


PAGES_SHOWING_NAMES = [
    # path                          as whom   (what shows the payload there)
    ("/",                           "anonymous"),  # run name
    ("/runs/{public}/",             "anonymous"),  # run name, description, leaderboard: display name
    ("/runs/{public}/",             "olga"),  # ... and the run's events for its organizer
    ("/runs/{public}/join/",        "vik"),  # run name
    ("/runs/{public}/edit/",        "olga"),  # run name and description in the form
    ("/runs/{public}/participants/", "olga"),  # display names, token names, ban reasons
    ("/teams/",                     "anonymous"),  # team name
    ("/teams/{team}/",      "anonymous"),  # team name, members' display names
    ("/tokens/",                    "vik"),  # token name
    ("/accounts/profile/",          "vik"),  # display name in the form
]


@pytest.mark.parametrize(("template", "persona"), PAGES_SHOWING_NAMES)
def test_chosen_names_render_escaped(world, hostile, template, persona):
    client = Client()
    if world.users[persona] is not None:
        client.force_login(world.users[persona])
    html = client.get(template.format(**hostile)).content.decode()
    assert SCRIPT not in html
    assert "<img src=x" not in html
    assert ESCAPED_SCRIPT in html, "the page shows the name (escaped), so this test can see a regression"


def test_a_new_token_name_renders_escaped_on_the_join_page(world, client_for):
    page = client_for(world.users["vik"]).post(f"/runs/{world.values['public']}/join/", {"action": "token", "machine": PAYLOAD})
    html = page.content.decode()
    assert SCRIPT not in html and "<img src=x" not in html
    assert ESCAPED_SCRIPT in html


def test_the_live_leaderboard_writes_names_as_text():
    """live.js builds the table from names chosen by volunteers: text nodes only, never markup."""
    source = (Path(settings.BASE_DIR) / "static" / "js" / "live.js").read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in source
    assert "td.textContent = text" in source


@pytest.mark.parametrize("path", ["/", "/api/v1/runs/", "/accounts/login/"])
def test_responses_carry_the_hardening_headers(db, client, path):
    response = client.get(path)
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["X-Frame-Options"] == "DENY"
    assert response["Referrer-Policy"] == "same-origin"
    assert response["Cross-Origin-Opener-Policy"] == "same-origin"
    policy = dict(directive.strip().split(" ", 1) for directive in response["Content-Security-Policy"].split(";"))
    assert policy["script-src"] == policy["style-src"] == policy["connect-src"] == "'self'", "no inline script or style"
    assert policy["object-src"] == policy["base-uri"] == policy["frame-ancestors"] == "'none'"


def test_no_template_holds_an_inline_script_handler_or_style_the_policy_would_refuse():
    """The browser tests report violations on the pages they visit; this reads every template, visited or not."""
    inline = re.compile(r'<script(?![^>]*\b(?:src=|type="application/json"))[^>]*>|\son[a-z]+=|\sstyle=', re.IGNORECASE)
    templates = sorted((Path(settings.BASE_DIR) / "templates").rglob("*.html"))
    offenders = [f"{path.name}: {match.group(0)}" for path in templates for match in inline.finditer(path.read_text())]
    assert templates and not offenders
