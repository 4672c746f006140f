"""A volunteer's own view of their machines (issue 32): each machine's samples split into confirmed, pending
and lost, how its latest session stands, and why each epoch that lost samples lost them, in both languages;
none of it shown to anyone else."""


import pytest
from django.utils import timezone

from runs.credit.rollup import run_credit_per_sample
from runs.models import SessionEpoch, TrainingSession
from tests.accounts.machines import amina_machines_make
from tests.factories import PASSWORD, UserFactory

pytestmark = pytest.mark.django_db
_Status = SessionEpoch.Status


@pytest.fixture
def amina_machines():
    return amina_machines_make()


def test_each_machine_shows_confirmed_pending_and_lost_samples_and_its_state(client, amina_machines):
    amina, run = amina_machines
    client.login(username="amina", password=PASSWORD)
    page = client.get("/volunteers/amina/")
    machines = {machine["name"]: machine for machine in page.context["machines"]}

    assert set(machines) == {"laptop", "cloud"}, "a restarted agent with its token is one machine"
    laptop, cloud = machines["laptop"], machines["cloud"]
    assert (laptop["samples"], laptop["confirmed"], laptop["pending"], laptop["lost"]) == (352, 112, 32, 208)
    assert laptop["state"] == "training" and cloud["state"] == "suspended"
    assert (cloud["samples"], cloud["confirmed"], cloud["pending"], cloud["lost"]) == (64, 0, 64, 0)
    assert run_credit_per_sample(run) > 0 and laptop["credit"] == pytest.approx(112 * run_credit_per_sample(run))
    assert laptop["credit_pending"] == pytest.approx(32 * run_credit_per_sample(run))
    assert cloud["suspension_reason"] == "2 failed spot checks"
    html = page.content.decode()
    assert 'data-state="suspended"' in html and 'data-state="training"' in html
    today = laptop["days"][-1]
    assert len(laptop["days"]) == 14 and today["day"] == timezone.now().date()
    assert (today["samples"], today["height"]) == (352, 100) and laptop["days"][0]["samples"] == 0, "all reported today"
    assert 'aria-label="Samples per day, last 14 days: 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 352"' in html


def test_every_epoch_that_lost_samples_says_why(client, amina_machines):
    client.login(username="amina", password=PASSWORD)
    page = client.get("/volunteers/amina/")
    reasons = {(row["machine"], row["epoch"]): (row["reason"], row["lost"]) for row in page.context["lost_epochs"]}

    assert reasons == {
        ("laptop", 2): ("no_commitment", 64), ("laptop", 3): ("fewer_announced", 16),
        ("laptop", 4): ("diverged", 64), ("laptop", 5): ("unchecked", 64), ("cloud", 4): ("suspended", 64),
    }
    html = page.content.decode()
    assert "nothing is held against you" in html and 'data-reason="diverged"' in html


def test_the_explanations_are_in_bengali_too(client, amina_machines):
    client.login(username="amina", password=PASSWORD)
    html = client.get("/volunteers/amina/", HTTP_ACCEPT_LANGUAGE="bn").content.decode()
    for reason in ("diverged", "unchecked", "no_commitment", "fewer_announced", "suspended"):
        assert f'data-reason="{reason}"' in html
    assert "nothing is held against you" not in html and "Your machines" not in html


@pytest.mark.parametrize("viewer", [None, "outsider"])
def test_nobody_else_sees_a_volunteers_machines_or_lost_epochs(client, amina_machines, viewer):
    if viewer:
        UserFactory(username=viewer)
        client.login(username=viewer, password=PASSWORD)
    page = client.get("/volunteers/amina/")
    assert page.status_code == 200
    assert page.context["machines"] is None and page.context["lost_epochs"] is None
    html = page.content.decode()
    assert "volunteer-machines" not in html and "volunteer-lost" not in html and "laptop" not in html


def test_the_agent_reads_its_machines_figures_as_the_page_shows_them(client, amina_machines):
    """The agent's display (peer_agent.portal.CreditWatcher) shows confirmed and pending credit from
    ``GET /api/v1/sessions/{id}/credit``: the machine of the asking session, its earlier sessions included.
    Another volunteer's session is not found; who may ask at all is tests/security/matrix.py's."""
    from accounts.services import token_create

    amina, run = amina_machines
    restarted = TrainingSession.objects.filter(user=amina, token__name="laptop", ended_at=None).get()
    secret = token_create(user=amina, name="reader")[1]
    answer = client.get(f"/api/v1/sessions/{restarted.pk}/credit", HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert answer.status_code == 200
    figures = answer.json()
    per_sample = run_credit_per_sample(run)
    assert figures == {"samples": 352, "confirmed_samples": 112, "pending_samples": 32, "lost_samples": 208,
                       "credit": pytest.approx(112 * per_sample), "credit_pending": pytest.approx(32 * per_sample)}
    suspended = TrainingSession.objects.get(user=amina, token__name="cloud")
    assert client.get(f"/api/v1/sessions/{suspended.pk}/credit",
                      HTTP_AUTHORIZATION=f"Bearer {secret}").json()["pending_samples"] == 64
    outsider = token_create(user=UserFactory(username="mallory"), name="laptop")[1]
    refused = client.get(f"/api/v1/sessions/{restarted.pk}/credit", HTTP_AUTHORIZATION=f"Bearer {outsider}")
    assert refused.status_code == 404 and refused.json()["error"]["code"] == "session_not_found"
