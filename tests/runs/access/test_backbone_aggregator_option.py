"""The organizer's `averaging.backbone_aggregates`: validated as any config field, editable mid-run (so
that it can be turned off), and the access token a backbone's aggregator holds names the aggregator role,
signed by the run's own authority (tests/e2e/test_backbone_aggregator.py runs it in a swarm)."""

import pytest
from django.conf import settings
from django.urls import reverse
from hivemind.utils.crypto import RSAPrivateKey
from pydantic import ValidationError

from peer_agent.authorizer import PortalAuthorizer, access_token_from_json, rsa_public_key_parse
from peer_agent.protocol import RunConfig, access_role
from runs.access.authority import authority_load
from runs.swarm.coordinator import aggregator_access_sign
from tests.factories import RunFactory
from tests.runs.run_forms import run_form_data

pytestmark = pytest.mark.django_db


def test_backbone_peers_do_not_aggregate_unless_the_organizer_asks():
    assert RunConfig().averaging.backbone_aggregates is False
    assert RunConfig.model_validate({"averaging": {"backbone_aggregates": True}}).averaging.backbone_aggregates


@pytest.mark.parametrize("value", ["maybe", 2, None, [True]])
def test_the_option_refuses_anything_but_a_boolean(value):
    with pytest.raises(ValidationError, match="backbone_aggregates"):
        RunConfig.model_validate({"averaging": {"backbone_aggregates": value}})


def test_an_organizer_turns_the_option_on_and_off_while_the_run_is_active(client_for, organizer):
    run = RunFactory(organizers=[organizer])
    client_for(organizer).post(reverse("run-edit", args=[run.slug]), run_form_data(averaging__backbone_aggregates="on"))
    run.refresh_from_db()
    assert run.config["averaging"]["backbone_aggregates"] is True
    assert run.events.get(kind="config_changed").detail == "averaging.backbone_aggregates"
    client_for(organizer).post(reverse("run-edit", args=[run.slug]), run_form_data())
    run.refresh_from_db()
    assert run.config["averaging"]["backbone_aggregates"] is False


def test_a_volunteer_cannot_turn_the_backbones_aggregators_on(client_for, volunteer):
    run = RunFactory()
    response = client_for(volunteer).post(reverse("run-edit", args=[run.slug]),
                                          run_form_data(averaging__backbone_aggregates="on"))
    assert response.status_code in (403, 404)
    run.refresh_from_db()
    assert run.config["averaging"].get("backbone_aggregates", False) is False


def _authorizer(run) -> PortalAuthorizer:
    return PortalAuthorizer(RSAPrivateKey(), rsa_public_key_parse(run.authority_public_key), lambda: None)


def test_a_backbone_aggregators_token_names_the_aggregator_role_and_the_runs_authority_signs_it():
    run, other = RunFactory(slug="bengali-albert"), RunFactory(slug="other-run")
    authority = authority_load(encrypted=run.authority_private_key, secret=settings.AUTHORITY_ENCRYPTION_KEY)
    key = RSAPrivateKey()
    token = access_token_from_json(aggregator_access_sign(authority=authority,
                                                          peer_public_key=key.get_public_key().to_bytes()))
    assert token.username == "coordinator#aggregator" and access_role(token.username) == "aggregator"
    assert token.public_key == key.get_public_key().to_bytes(), "it names the aggregator's own key"
    assert _authorizer(run).is_token_valid(token), "the run's peers admit it"
    assert not _authorizer(other).is_token_valid(token), "another run's peers do not"
