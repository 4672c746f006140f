"""Contribution certificates: their figures are the board's, recomputed each time; only the volunteer
downloads theirs; the verify page tells a forged link from a real one; Bengali names are drawn with
a Bengali font (runs/credit/certificates.py)."""

import io
import logging
import re
import secrets

import pytest
from PIL import Image

from runs.credit.certificates import font_covers, font_for, font_paths, text_runs
from runs.credit.rollup import credit_rollup
from runs.models import Certificate, Run
from tests.factories import RunFactory, UserFactory, report, session_for

pytestmark = pytest.mark.django_db


@pytest.fixture
def board(db, clock):
    """A run where amina, vik and a hidden volunteer have confirmed work, and a newcomer has only pending work."""
    run = RunFactory(slug="bangla", name="Bangla ALBERT")
    users = {name: UserFactory(username=name, **extra) for name, extra in (
        ("amina", {"display_name": "আমিনা"}), ("vik", {}), ("ghost", {"visibility": "hidden"}), ("newcomer", {}))}
    for name, samples in (("amina", 900), ("vik", 400), ("ghost", 600)):
        report(session_for(run, users[name]), samples)
    report(session_for(run, users["newcomer"]), 5000, confirmed=False)
    credit_rollup()
    return run, users


def svg_of(client, user, slug="bangla"):
    client.force_login(user)
    response = client.get(f"/runs/{slug}/certificate.svg")
    client.logout()
    return response


def verify_path(svg: str) -> str:
    return re.search(r'href="https?://[^/"]+(/certificates/[^"]+)"', svg).group(1)


def test_a_certificate_states_the_board_s_figures_and_its_page_recomputes_them(client, board):
    run, users = board
    response = svg_of(client, users["vik"])
    assert response.status_code == 200 and response["Content-Type"] == "image/svg+xml"
    assert response["Content-Disposition"] == 'attachment; filename="bangla-certificate.svg"'
    svg = response.content.decode()
    row = next(row for row in client.get("/api/v1/runs/bangla/leaderboard").json() if row["name"] == "vik")
    ranked = len(client.get("/api/v1/runs/bangla/leaderboard").json())
    assert f"contributed {row['credit']:,.0f} GFLOP of confirmed training compute" in svg
    assert f"rank {row['rank']} of {ranked} volunteers · {row['samples']:,} confirmed samples" in svg
    assert "to Bangla ALBERT, training ALBERT (tiny)" in svg and ">vik<" in svg
    page = client.get(verify_path(svg))
    assert page.status_code == 200 and "This certificate is genuine" in page.content.decode()
    assert page.context["facts"].credit == row["credit"] and page.context["facts"].rank == row["rank"]
    # vik trains more and overtakes amina: the same link states the new figures, from the board.
    report(session_for(run, users["vik"], machine="second"), 1000, epoch=2)
    credit_rollup()
    row = next(row for row in client.get("/api/v1/runs/bangla/leaderboard").json() if row["name"] == "vik")
    assert row["rank"] == 1
    facts = client.get(verify_path(svg)).context["facts"]
    assert (facts.rank, facts.credit, facts.samples) == (row["rank"], row["credit"], row["samples"])


def test_only_the_volunteer_downloads_their_certificate(client, board, outsider):
    _, users = board
    assert client.get("/runs/bangla/certificate.png").status_code == 302  # to the log-in page
    for stranger in (outsider, users["newcomer"]):  # no confirmed credit of their own: pending work earns none
        assert svg_of(client, stranger).status_code == 404
    assert Certificate.objects.filter(user__in=[outsider, users["newcomer"]]).count() == 0
    assert client.get("/runs/bangla/certificate.pdf").status_code == 404
    assert svg_of(client, users["vik"], slug="no-such-run").status_code == 404


def test_a_hidden_volunteer_s_certificate_is_theirs_alone(client, board, outsider):
    _, users = board
    svg = svg_of(client, users["ghost"]).content.decode()
    assert ">ghost<" in svg and "rank 2 of 3 volunteers" in svg  # ranked as if on the board
    path = verify_path(svg)
    for viewer in (None, outsider, users["vik"]):
        if viewer:
            client.force_login(viewer)
        page = client.get(path)
        assert page.status_code == 404 and "ghost" not in page.content.decode()
        client.logout()
    client.force_login(users["ghost"])
    assert client.get(path).status_code == 200


def test_a_members_only_run_s_certificate_is_verified_only_for_who_may_see_the_run(client, board, outsider):
    run, users = board
    svg = svg_of(client, users["vik"]).content.decode()
    Run.objects.filter(pk=run.pk).update(audience=Run.Audience.MEMBERS, visibility=Run.Visibility.ALLOWLIST)
    client.force_login(outsider)
    assert client.get(verify_path(svg)).status_code == 404


@pytest.mark.parametrize("forge", ["random", "flipped", "short", "markup"])
def test_a_forged_verify_link_says_so(client, board, forge):
    _, users = board
    code = verify_path(svg_of(client, users["vik"]).content.decode()).split("/")[2]
    forged = {"random": secrets.token_urlsafe(16), "flipped": ("A" if code[0] != "A" else "B") + code[1:],
              "short": code[:8], "markup": "%3Cscript%3Ealert(1)%3C%5Cscript%3E"}[forge]
    page = client.get(f"/certificates/{forged}/")
    assert page.status_code == 404
    assert "it is forged or mistyped" in page.content.decode()


def test_certificate_codes_are_random_and_long(board):
    run, users = board
    codes = {Certificate.objects.create(run=run, user=user).code for user in users.values()}
    assert len(codes) == len(users) and all(len(code) >= 22 for code in codes)


def test_the_png_draws_a_bengali_name_with_a_bengali_font(client, board):
    _, users = board
    client.force_login(users["amina"])
    response = client.get("/runs/bangla/certificate.png")
    assert response.status_code == 200 and response["Content-Type"] == "image/png"
    image = Image.open(io.BytesIO(response.content))
    assert image.size == (1200, 850)
    assert text_runs("আমিনা (amina)") == [("bengali", "আমিনা "), ("latin", "(amina)")]
    assert font_paths()["bengali"] is not None, "fonts-lohit-beng-bengali is installed where the tests run"
    assert all(font_covers(font_for("bengali", 64), char) for char in "আমিনা")
    assert not font_covers(font_for("latin", 64), "আ"), "the Latin font alone would draw boxes"
    # The name's line (baseline 300) holds ink in the name's colour.
    name_band = image.crop((100, 240, 1100, 310)).getcolors(maxcolors=1 << 16)
    assert any(colour == (29, 78, 216) for _, colour in name_band)


def test_without_a_bengali_font_the_png_still_renders_and_the_log_says_what_to_install(client, board, settings, tmp_path,
                                                                                      caplog):
    _, users = board
    settings.CERTIFICATE_FONT_DIRS = [str(tmp_path)]
    font_paths.cache_clear()
    font_for.cache_clear()
    try:
        client.force_login(users["amina"])
        with caplog.at_level(logging.WARNING, logger="runs.credit.certificates"):
            response = client.get("/runs/bangla/certificate.png")
        assert response.status_code == 200 and Image.open(io.BytesIO(response.content)).size == (1200, 850)
        assert "install fonts-lohit-beng-bengali" in caplog.text
    finally:
        font_paths.cache_clear()
        font_for.cache_clear()


def test_a_name_with_markup_is_text_in_the_svg_and_on_the_verify_page(client, board):
    _, users = board
    vik = users["vik"]
    vik.display_name = '</text><script>alert(1)</script>'
    vik.save()
    svg = svg_of(client, vik).content.decode()
    assert "<script>" not in svg and "&lt;/text&gt;&lt;script&gt;" in svg
    assert "<script>alert(1)" not in client.get(verify_path(svg)).content.decode()


def test_the_run_page_links_the_certificate_for_a_volunteer_with_confirmed_credit_only(client, board):
    _, users = board
    client.force_login(users["vik"])
    assert 'href="/runs/bangla/certificate.png"' in client.get("/runs/bangla/").content.decode()
    client.force_login(users["newcomer"])  # pending work only
    assert "certificate.png" not in client.get("/runs/bangla/").content.decode()
