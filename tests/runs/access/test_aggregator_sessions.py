"""Aggregator sessions: an organizer's peer that only helps average joins as "aggregator", its access
token names the role, and the portal takes no samples from it (a cheater could try to earn credit there)."""

import json

import pytest
from hivemind.utils.crypto import RSAPrivateKey

from accounts.services import token_create
from peer_agent.authorizer import access_token_from_json
from peer_agent.protocol import JoinResponse, access_role
from runs.models import ContributionEvent, ReportRejection, TrainingSession
from tests.agent_wire import exchange, post, report
from tests.factories import RunFactory, join_body

JOIN = "/api/v1/runs/bengali-albert/join"


@pytest.fixture
def run(organizer):
    return RunFactory(slug="bengali-albert", organizers=[organizer])


def _join(client, user, role):
    secret = token_create(user=user, name="server")[1]
    return post(client, JOIN, secret, join_body("bengali-albert", RSAPrivateKey(), role=role)), secret


def test_an_organizer_joins_as_an_aggregator_and_its_signed_token_names_the_role(client, run, organizer):
    response, secret = _join(client, organizer, "aggregator")
    assert response.status_code == 200, response.content
    answer = JoinResponse.model_validate(response.json())
    assert answer.role == "aggregator" and answer.hivemind_access.role == "aggregator"
    token = access_token_from_json(answer.hivemind_access.model_dump())
    assert token.username == "olga#aggregator" and access_role(token.username) == "aggregator"
    assert TrainingSession.objects.get(pk=answer.session_id).role == "aggregator"

    refreshed = post(client, f"/api/v1/sessions/{answer.session_id}/refresh", secret)
    assert refreshed.status_code == 200
    assert refreshed.json()["hivemind_access"]["username"] == "olga#aggregator", "a refresh keeps the role"


def test_a_trainers_token_names_no_role_suffix(client, run, volunteer):
    response, _ = _join(client, volunteer, "trainer")
    assert response.status_code == 200, response.content
    assert response.json()["role"] == "trainer" and response.json()["hivemind_access"]["username"] == "vik"


@pytest.mark.parametrize("who", ["volunteer", "outsider"])
def test_only_organizers_may_join_as_an_aggregator(client, run, request, who):
    response, _ = _join(client, request.getfixturevalue(who), "aggregator")
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "not_an_organizer"
    assert "join as a trainer" in response.json()["error"]["detail"]
    assert not TrainingSession.objects.exists()


def test_an_unknown_role_is_a_400(client, run, organizer):
    secret = token_create(user=organizer, name="server")[1]
    response = post(client, JOIN, secret, {**join_body("bengali-albert"), "role": "parameter-server"})
    assert response.status_code == 400
    assert "role" in json.dumps(response.json()["error"])
    assert not TrainingSession.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_an_aggregator_that_reports_samples_is_refused_and_earns_nothing(client, run, organizer):
    """The cheater: an organizer's aggregator session claims the samples a trainer would."""
    response, secret = _join(client, organizer, "aggregator")
    session_id = response.json()["session_id"]

    answers = exchange(secret, [report(session_id, 1), report(session_id, 2, samples=0)])

    assert [answer.get("code") for answer in answers] == ["samples_from_aggregator"] * 2, answers
    assert "joined as an aggregator" in answers[0]["detail"]
    assert not ContributionEvent.objects.exists()
    assert ReportRejection.objects.filter(session_id=session_id, code="samples_from_aggregator").count() == 2
