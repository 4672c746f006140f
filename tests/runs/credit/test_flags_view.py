"""The flagged-credit page: a run's organizers (and staff) see the flagged epochs with their
figures and accept or reject them; nobody else sees or decides anything."""

import pytest
from django.test import Client
from django.urls import reverse

from runs.credit import verification
from runs.models import RunEvent, SessionEpoch
from tests.factories import RunFactory, UserFactory
from tests.runs.epochs import judge, report, session_for


@pytest.fixture
def flagged(organizer):
    run = RunFactory(slug="the-run", organizers=[organizer])
    session = session_for(run, "amina")
    report(session, 64, epoch=3)
    verification.announced_record(session_id=session.pk, epoch=3, announced=32)
    judge(run, 3)
    return SessionEpoch.objects.get(session=session, epoch=3)


def decide_url(flag, decision):
    return reverse("run-flag-decide", kwargs={"slug": "the-run", "pk": flag.pk, "decision": decision})


def test_the_organizer_sees_the_flag_with_its_figures_and_rejects_it(client_for, organizer, flagged):
    client = client_for(organizer)
    assert "Flagged credit" in client.get(reverse("run-detail", args=["the-run"])).content.decode()
    page = client.get(reverse("run-flags", args=["the-run"])).content.decode()
    assert "amina" in page and "reported 64 samples" in page and "announced 32" in page

    response = client.post(decide_url(flagged, "reject"))
    assert response.status_code == 302 and response["Location"] == reverse("run-flags", args=["the-run"])
    flagged.refresh_from_db()
    assert (flagged.status, flagged.decided_by) == ("rejected", organizer)
    assert RunEvent.objects.filter(run=flagged.session.run, kind=verification.EVENT_CREDIT_REJECTED, actor=organizer).exists()
    assert "Nothing is flagged" in client.get(reverse("run-flags", args=["the-run"])).content.decode()
    client.post(decide_url(flagged, "accept"))
    flagged.refresh_from_db()
    assert flagged.status == "rejected", "a decided epoch cannot be decided again"


def test_the_organizer_sees_the_peers_that_served_states_unlike_the_swarms_most_first(client_for, organizer, flagged):
    """The validator counts them on their sessions (runs/swarm/spotcheck.py, ``Validator.tallies_save``)."""
    run = flagged.session.run
    page = client_for(organizer).get(reverse("run-flags", args=["the-run"])).content.decode()
    assert 'id="disagreeing"' not in page, "no such peer: no table"
    for name, served, disagreed in (("rahim", 40, 2), ("mallory", 38, 37), ("salma", 40, 0)):
        session = session_for(run, name)
        session.states_served, session.states_disagreed = served, disagreed
        session.save(update_fields=["states_served", "states_disagreed"])
    page = client_for(organizer).get(reverse("run-flags", args=["the-run"])).content.decode()
    table = page[page.index('id="disagreeing"'):]
    assert table.index("mallory") < table.index("rahim") and "salma" not in table
    assert "<td>37</td><td>38</td>" in table and 'href="/runs/the-run/participants/"' in page


def test_staff_may_accept(client_for, staff, flagged):
    assert client_for(staff).get(reverse("run-flags", args=["the-run"])).status_code == 200
    client_for(staff).post(decide_url(flagged, "accept"))
    flagged.refresh_from_db()
    assert (flagged.status, flagged.decided_by) == ("accepted", staff)


@pytest.mark.parametrize("who", ["outsider", "volunteer", "other_organizer"])
def test_nobody_else_sees_or_decides_flags(client_for, outsider, volunteer, flagged, who):
    user = {"outsider": outsider, "volunteer": volunteer,
            "other_organizer": UserFactory(username="otto", organizer=True)}[who]
    if who == "volunteer":
        report(session_for(flagged.session.run, user=volunteer), 8, epoch=3)  # a volunteer of this very run
    client = client_for(user)
    assert client.get(reverse("run-flags", args=["the-run"])).status_code == 403
    assert client.post(decide_url(flagged, "accept")).status_code == 403
    flagged.refresh_from_db()
    assert flagged.status == "flagged"


def test_anonymous_visitors_are_sent_to_log_in_and_drafts_stay_hidden(client_for, outsider, flagged):
    response = client_for(None).post(decide_url(flagged, "accept"))
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")
    RunFactory(slug="a-draft", status="draft")
    assert client_for(outsider).get(reverse("run-flags", args=["a-draft"])).status_code == 404


def test_decisions_need_post_with_a_csrf_token_and_a_flag_of_this_run(organizer, flagged):
    client = Client(enforce_csrf_checks=True)
    client.force_login(organizer)
    assert client.get(decide_url(flagged, "accept")).status_code == 405
    assert client.post(decide_url(flagged, "accept")).status_code == 403
    other = RunFactory(slug="other-run", organizers=[organizer])
    logged_in = Client()
    logged_in.force_login(organizer)
    url = reverse("run-flag-decide", kwargs={"slug": other.slug, "pk": flagged.pk, "decision": "accept"})
    assert logged_in.post(url).status_code == 404
    assert logged_in.post(decide_url(flagged, "approve")).status_code == 404
    flagged.refresh_from_db()
    assert flagged.status == "flagged"
