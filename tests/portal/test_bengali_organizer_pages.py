"""An organizer who reads Bengali: the organizer panel of the run page, the health page, the run form,
the participants and flagged-credit pages and the messages after each action come in Bengali, with
Bengali digits, and leave no English word but names (of the run, its volunteers, files and tools)."""

import datetime
import html
import re

import pytest
from django.conf import settings
from django.utils import timezone

from runs.models import Checkpoint, DataFile, Run, RunEvent, RunSample, SessionEpoch
from runs.setup.services import run_ban
from tests.factories import RunFactory, UserFactory, session_for

pytestmark = pytest.mark.django_db

# Names a Bengali page shows as they are: the run's, its people's and machines', the tools'.
NAMES = {"Bangla", "ALBERT", "olga", "amina", "mallory", "laptop", "DeDLOC", "Portal", "UTF", "MiB", "hivemind",
         "Unigram", "LAMB", "Hugging", "Face", "GFLOP", "API", "JSON", "UTC", "LM", "BERT", "sahajBERT", "CPU", "CUDA",
         "DHT", "mean", "auto", "tiny", "ISO", "Parquet", "Arrow"}
SHOWN = re.compile(r"<(script|style|code|textarea|select)\b[^>]*>.*?</\1>|<[^>]*>", re.S | re.I)
QUOTED = re.compile(r'"[^"]*"|“[^”]*”')  # values as the reader types them: "custom", “bangla”


def english_words(page: str) -> set[str]:
    """The English words a reader sees in ``page``, less names: not in code, scripts, attributes or quotes,
    nor identifiers (hidden_size, docs/trust.md, fp16, peer-agent)."""
    tokens = re.findall(r"[\w./<>-]+", QUOTED.sub(" ", html.unescape(SHOWN.sub(" ", page))))
    return {token for token in tokens if re.fullmatch(r"[A-Za-z]{2,}", token)} - NAMES


def main_of(response) -> str:
    assert response.status_code == 200
    return re.search(r"<main>(.*)</main>", response.content.decode(), re.S).group(1)


@pytest.fixture
def bengali_organizer(client_for, organizer):
    organizer.username = "olga"
    organizer.save()
    client = client_for(organizer)
    client.cookies[settings.LANGUAGE_COOKIE_NAME] = "bn"
    return client


@pytest.fixture
def bangla(organizer):
    now = timezone.now()
    run = RunFactory(name="Bangla ALBERT", slug="bangla", organizers=[organizer], coordinator_peer_id="QmBackbone",
                     coordinator_heartbeat_at=now, visibility=Run.Visibility.ALLOWLIST)
    RunSample.objects.bulk_create(
        RunSample(run=run, at=now - datetime.timedelta(minutes=30 - i), global_epoch=10 + i // 10,
                  samples_per_second=1234.5, alive_peers=3, client_peers=1, loss=4.0 - i / 100) for i in range(31))
    session = session_for(run, UserFactory(username="amina"))
    session.ended_at = now - datetime.timedelta(minutes=2)
    session.save()
    SessionEpoch.objects.create(session=session, epoch=11, reported_samples=640, announced_samples=64,
                                status=SessionEpoch.Status.FLAGGED, detail="640 ≠ 64")
    Checkpoint.objects.create(run=run, epoch=12, file="checkpoints/x.zip", created_at=now - datetime.timedelta(minutes=9))
    run_ban(run=run, actor=organizer, user=UserFactory(username="mallory"), reason="")
    RunEvent.objects.create(run=run, kind=RunEvent.Kind.PAUSED, at=now - datetime.timedelta(minutes=8))
    return run


def test_the_organizer_panel_reads_bengali(bengali_organizer, bangla):
    page = main_of(bengali_organizer.get("/runs/bangla/"))
    panel = re.search(r'<section class="panel organizer">(.*?)</section>', page, re.S).group(1)
    for words in ("আয়োজক", "বিরতি দিন", "কনফিগারেশন সম্পাদনা করুন", "অনুমোদিত তালিকা সংরক্ষণ করুন", "অডিট লগ",
                  "নিষিদ্ধ", "রানটি চিরতরে শেষ করবেন?"):
        assert words in panel, words
    assert english_words(panel) == set()
    assert "০\xa0বাইট" in page, "a checkpoint's size in Bengali digits"


def test_a_draft_runs_data_and_tokenizer_controls_read_bengali(bengali_organizer, organizer):
    run = RunFactory(name="Bangla ALBERT", slug="draft", organizers=[organizer], status=Run.Status.DRAFT,
                     tokenizer_status=Run.TokenizerStatus.MISSING)
    DataFile.objects.create(run=run, name="news.txt", file="data/news.txt", size=2048, lines=12345)
    panel = main_of(bengali_organizer.get("/runs/draft/"))
    assert "১২,৩৪৫" in panel, "lines in Bengali digits"
    assert "৪,০০০ টোকেনের একটি ইউনিগ্রাম টোকেনাইজার" in panel
    assert "LAMB, লার্নিং রেট ০.০০১৭৬, ৫,০০০টি ধাপের মধ্যে ২০টি ওয়ার্ম-আপ" in panel, "the configuration in Bengali digits"
    assert english_words(panel) == set()


def test_the_health_page_reads_bengali_with_bengali_digits(bengali_organizer, bangla):
    page = main_of(bengali_organizer.get("/runs/bangla/health/"))
    for words in ("কোঅর্ডিনেটর", "সময়রেখা", "একটি পিয়ার যোগ দিয়েছে", "একটি পিয়ার চলে গেছে", "ইপক ১২-এর চেকপয়েন্ট",
                  "১,২৩৪.৫", "(১টি সেশনে)"):
        assert words in page, words
    assert english_words(page) == set()


@pytest.mark.parametrize("path", ["/runs/bangla/edit/", "/runs/new/", "/runs/bangla/participants/", "/runs/bangla/flags/"])
def test_the_other_organizer_pages_read_bengali(bengali_organizer, bangla, path):
    assert english_words(main_of(bengali_organizer.get(path))) == set()


def test_a_refused_lifecycle_action_is_explained_in_bengali(bengali_organizer, bangla):
    bangla.status = Run.Status.FINISHED
    bangla.save()
    page = main_of(bengali_organizer.post("/runs/bangla/status/resume/", follow=True))
    assert "সমাপ্ত অবস্থার রান আবার চালু করা যায় না" in page


def test_an_allowlist_naming_nobody_is_refused_in_bengali(bengali_organizer, bangla):
    page = main_of(bengali_organizer.post("/runs/bangla/allowlist/", {"usernames": "amina, nobody"}, follow=True))
    assert "nobody নামে কোনো স্বেচ্ছাসেবক নেই" in page


def test_a_refused_team_action_is_explained_in_bengali(client_for, volunteer):
    client = client_for(volunteer)
    client.cookies[settings.LANGUAGE_COOKIE_NAME] = "bn"
    client.post("/teams/new/", {"name": "Dhaka Compute"})
    page = main_of(client.post("/teams/dhaka-compute/leave/", follow=True))
    assert "আপনি “Dhaka Compute” প্রতিষ্ঠা করেছেন; আগে এটি অন্য সদস্যের কাছে হস্তান্তর করুন বা ভেঙে দিন" in page
