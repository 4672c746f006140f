"""A Bengali reader: the pages, the live page's JavaScript words and the numbers come in Bengali, and
the language switcher's choice sticks for a year without the browser asking for it."""

import json
import re

import pytest
from django.conf import settings
from django.core import mail

from runs.credit.rollup import credit_rollup
from runs.models import Run
from tests.factories import NOW, PASSWORD, RunFactory, UserFactory, report, session_for, signup_link_in

pytestmark = pytest.mark.django_db


def text_of(response) -> str:
    return re.sub(r"\s+", " ", response.content.decode())


def test_a_browser_asking_for_bengali_gets_bengali_pages(client):
    for path, words in [("/", "একসাথে ভাষা মডেল প্রশিক্ষণ দিন।"), ("/accounts/signup/", "স্বেচ্ছাসেবক হোন"),
                        ("/accounts/login/", "পাসওয়ার্ড ভুলে গেছেন?"), ("/teams/", "এখনো কোনো দল নেই।"),
                        ("/runs/", "রান খুঁজুন"), ("/leaderboard/", "লিডারবোর্ড, সব রান"),
                        ("/accounts/signup/sent/", "আপনার দেওয়া ঠিকানায় আমরা একটি বার্তা পাঠিয়েছি।"),
                        ("/accounts/signup/confirm/not-a-link/", "আপনার অ্যাকাউন্ট তৈরি হয়নি")]:
        page = text_of(client.get(path, HTTP_ACCEPT_LANGUAGE="bn-BD,bn;q=0.9,en;q=0.5"))
        assert '<html lang="bn">' in page, path
        assert words in page, path


def test_a_bengali_sign_up_gets_its_link_and_its_welcome_in_bengali(client):
    client.cookies[settings.LANGUAGE_COOKIE_NAME] = "bn"
    client.post("/accounts/signup/", {"username": "amina", "email": "amina@example.org", "password1": PASSWORD,
                                      "password2": PASSWORD})
    link = signup_link_in(mail.outbox[0])
    assert "অ্যাকাউন্ট তৈরি করতে এই লিংকটি খুলুন" in mail.outbox[0].body
    assert "“amina” অ্যাকাউন্টটি তৈরি করে লগ ইন করবেন?" in text_of(client.get(link))
    client.post(link)
    assert "স্বাগতম, amina!" in text_of(client.get("/tokens/"))


def test_the_switcher_remembers_bengali_for_a_year_over_the_browsers_english(client):
    response = client.post("/i18n/setlang/", {"language": "bn", "next": "/runs/"}, HTTP_ACCEPT_LANGUAGE="en")
    assert response.status_code == 302 and response["Location"] == "/runs/"
    cookie = response.cookies[settings.LANGUAGE_COOKIE_NAME]
    assert cookie.value == "bn" and cookie["max-age"] == 365 * 24 * 3600
    assert "রান খুঁজুন" in text_of(client.get("/runs/", HTTP_ACCEPT_LANGUAGE="en"))
    client.post("/i18n/setlang/", {"language": "en", "next": "/runs/"})
    assert "Search runs" in text_of(client.get("/runs/", HTTP_ACCEPT_LANGUAGE="bn"))


def test_an_unknown_language_is_not_set(client):
    response = client.post("/i18n/setlang/", {"language": "xx", "next": "/"})
    assert response.status_code == 302
    assert settings.LANGUAGE_COOKIE_NAME not in response.cookies


def test_the_javascript_catalog_carries_the_live_pages_words_in_bengali(client):
    client.cookies[settings.LANGUAGE_COOKIE_NAME] = "bn"
    catalog = client.get("/jsi18n/").content.decode()
    # json.dumps escapes as the catalog does: the words are \u escapes in the script.
    assert json.dumps("এখনো কোনো অবদান নেই।") in catalog
    assert json.dumps("দৈনিক নমুনা ও ক্রেডিট") in catalog


def test_board_figures_are_grouped_and_written_in_bengali_digits(client):
    run = RunFactory(name="Bangla ALBERT", slug="bangla")
    amina = UserFactory(username="amina", display_name="Amina")
    report(session_for(run, amina), samples=123456, at=NOW)
    credit_rollup()
    client.cookies[settings.LANGUAGE_COOKIE_NAME] = "bn"
    page = text_of(client.get("/runs/bangla/"))
    assert "১,২৩,৪৫৬" in page  # samples in Bengali digits, grouped as Bengali readers write them
    assert '<time class="local" datetime="2026-11-29T12:30:00+00:00">২০২৬-১১-২৯ ১২:৩০ UTC</time>' in page
    client.cookies[settings.LANGUAGE_COOKIE_NAME] = "en"
    assert "123,456" in text_of(client.get("/runs/bangla/"))


def test_a_refused_join_reads_bengali_on_the_join_page(client_for, volunteer):
    """(Agents send no Accept-Language: the API's refusals stay English, tests/runs/api/test_join_api.py.)"""
    RunFactory(slug="bangla", status=Run.Status.PAUSED)
    client = client_for(volunteer)
    client.cookies[settings.LANGUAGE_COOKIE_NAME] = "bn"
    assert "“bangla” রানটি আয়োজক বিরতিতে রেখেছেন" in text_of(client.get("/runs/bangla/join/"))
