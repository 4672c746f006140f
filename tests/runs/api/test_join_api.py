"""Joining a run and refreshing hivemind access, exactly as the wire contract says."""

import datetime
import json

import pytest
from django.utils import timezone
from hivemind.utils.crypto import RSAPrivateKey, RSAPublicKey

from accounts.services import token_create, token_revoke
from peer_agent import SWARM_COMPATIBLE_SINCE, __version__
from peer_agent.authorizer import PortalAuthorizer, access_token_from_json
from peer_agent.protocol import JoinResponse, join_proof_message
from runs.models import Run, RunMembership, TrainingSession
from runs.setup.services import data_file_add, run_allowlist_set, run_ban
from tests.agent_wire import post
from tests.factories import BACKBONE_ADDRESS, RunFactory, UserFactory, join_body


@pytest.fixture
def run(organizer):
    return RunFactory(slug="bengali-albert", organizers=[organizer])


@pytest.fixture
def secret(volunteer):
    return token_create(user=volunteer, name="laptop")[1]


def test_join_returns_everything_an_agent_needs(client, run, volunteer, secret):
    data_file_add(run=run, actor=None, name="bn.txt", content="আমি বাংলায় গান গাই।\n".encode())
    key = RSAPrivateKey()
    response = post(client, "/api/v1/runs/bengali-albert/join", secret, join_body("bengali-albert", key))
    assert response.status_code == 200, response.content
    answer = JoinResponse.model_validate(response.json())
    assert answer.run_id == run.hivemind_run_id
    assert answer.config.model.preset == "tiny"
    assert answer.report_url == "ws://testserver/ws/agent/"
    session = TrainingSession.objects.get(pk=answer.session_id)
    assert (session.user, session.run, session.device["name"]) == (volunteer, run, "test CPU")

    authorizer = PortalAuthorizer(key, RSAPublicKey.from_bytes(answer.authority_public_key.encode()), lambda: None)
    token = access_token_from_json(answer.hivemind_access.model_dump())
    assert authorizer.is_token_valid(token), "the access token verifies against the run's authority"
    assert token.username == "vik"

    served = client.get(answer.data_files[0].removeprefix("http://testserver"))
    assert served.status_code == 200
    assert "বাংলায়" in b"".join(served.streaming_content).decode()


@pytest.mark.parametrize("declared", [None, 1, 16])
def test_a_join_fixes_the_sessions_micro_batch_its_override_or_the_runs(client, run, secret, declared):
    body = {**join_body("bengali-albert"), "per_device_batch_size": declared}
    response = post(client, "/api/v1/runs/bengali-albert/join", secret, body)
    assert response.status_code == 200, response.content
    training = run.config["training"]
    expected = declared or training["per_device_batch_size"]
    assert TrainingSession.objects.get(pk=response.json()["session_id"]).micro_batch_size == expected


def test_a_join_declaring_a_micro_batch_past_the_runs_limit_is_refused_with_a_reason(client, run, secret):
    training = run.config["training"]
    limit = training["target_batch_size"] // training["gradient_accumulation_steps"]
    body = {**join_body("bengali-albert"), "per_device_batch_size": limit + 1}
    response = post(client, "/api/v1/runs/bengali-albert/join", secret, body)
    assert response.status_code == 409, response.content
    error = response.json()["error"]
    assert error["code"] == "batch_size_too_large"
    assert f"more than this run allows a peer ({limit}" in error["detail"]
    assert not TrainingSession.objects.exists()


def test_join_names_the_backbone_peer_while_its_coordinator_beats(client, run, secret):
    response = post(client, "/api/v1/runs/bengali-albert/join", secret, join_body("bengali-albert"))
    assert response.status_code == 200, response.content
    assert response.json()["initial_peers"] == run.initial_peers


@pytest.mark.parametrize("silent_for, addresses", [(31, [BACKBONE_ADDRESS]), (None, [BACKBONE_ADDRESS]), (0, [])])
def test_without_a_live_coordinator_a_join_is_a_503_to_retry_and_opens_no_session(client, run, secret, settings,
                                                                                  silent_for, addresses):
    """A coordinator silent for longer than the stale limit, one that never beat, one that withdrew its addresses."""
    settings.COORDINATOR_HEARTBEAT_STALE_SECONDS = 30
    beat = None if silent_for is None else timezone.now() - datetime.timedelta(seconds=silent_for)
    Run.objects.filter(pk=run.pk).update(coordinator_heartbeat_at=beat, initial_peers=addresses)
    response = post(client, "/api/v1/runs/bengali-albert/join", secret, join_body("bengali-albert"))
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "coordinator_unavailable"
    assert "retry every 10 s" in response.json()["error"]["detail"]
    assert response["Retry-After"] == "10"
    assert not TrainingSession.objects.exists()


def test_refresh_gives_a_fresh_token_until_the_volunteer_is_banned(client, run, organizer, volunteer, secret):
    session_id = post(client, "/api/v1/runs/bengali-albert/join", secret, join_body("bengali-albert")).json()["session_id"]
    refreshed = post(client, f"/api/v1/sessions/{session_id}/refresh", secret)
    assert refreshed.status_code == 200
    assert refreshed.json()["hivemind_access"]["username"] == "vik"

    run_ban(run=run, actor=organizer, user=volunteer, reason="test")
    refused = post(client, f"/api/v1/sessions/{session_id}/refresh", secret)
    assert refused.status_code in {403, 409}
    again = post(client, "/api/v1/runs/bengali-albert/join", secret, join_body("bengali-albert"))
    assert (again.status_code, again.json()["error"]["code"]) == (403, "banned")


def test_refresh_is_refused_once_the_token_is_revoked_or_the_run_finishes(client, run, volunteer, secret):
    session_id = post(client, "/api/v1/runs/bengali-albert/join", secret, join_body("bengali-albert")).json()["session_id"]
    run.status = "finished"
    run.save()
    finished = post(client, f"/api/v1/sessions/{session_id}/refresh", secret)
    assert (finished.status_code, finished.json()["error"]["code"]) == (409, "run_finished")
    from accounts.models import AgentToken

    token_revoke(token=AgentToken.objects.get(user=volunteer))
    revoked = post(client, f"/api/v1/sessions/{session_id}/refresh", secret)
    assert (revoked.status_code, revoked.json()["error"]["code"]) == (401, "token_revoked")


def test_someone_elses_session_cannot_be_refreshed(client, run, secret, outsider):
    session_id = post(client, "/api/v1/runs/bengali-albert/join", secret, join_body("bengali-albert")).json()["session_id"]
    _, other_secret = token_create(user=outsider, name="x")
    response = post(client, f"/api/v1/sessions/{session_id}/refresh", other_secret)
    assert (response.status_code, response.json()["error"]["code"]) == (404, "session_not_found")


@pytest.mark.parametrize(
    ("status", "code"), [("paused", "run_paused"), ("finished", "run_finished")]
)
def test_join_is_refused_with_409_when_the_run_is_not_active(client, run, secret, status, code):
    run.status = status
    run.save()
    response = post(client, "/api/v1/runs/bengali-albert/join", secret, join_body("bengali-albert"))
    assert (response.status_code, response.json()["error"]["code"]) == (409, code)
    if status == "paused":
        assert "paused by its organizer" in response.json()["error"]["detail"]


def test_join_of_an_unknown_or_draft_run_is_404(client, organizer, secret):
    RunFactory(slug="secret-draft", status="draft", organizers=[organizer])
    for slug in ("no-such-run", "secret-draft"):
        response = post(client, f"/api/v1/runs/{slug}/join", secret, join_body("bengali-albert"))
        assert (response.status_code, response.json()["error"]["code"]) == (404, "run_not_found")


@pytest.mark.parametrize(
    "body",
    [
        {"peer_public_key": "ssh-rsa AAAA", "agent_version": __version__, "device": {"kind": "cpu", "name": "x"}},
        {"peer_public_key": "not a key", "agent_version": __version__, "device": {"kind": "cpu", "name": "x"}},
        {"agent_version": __version__, "device": {"kind": "cpu", "name": "x"}},
        {"peer_public_key": "ssh-rsa AAAA", "agent_version": __version__, "device": {"kind": "tpu", "name": "x"}},
    ],
)
def test_a_malformed_join_is_a_400_that_names_the_field(client, run, secret, body):
    response = post(client, "/api/v1/runs/bengali-albert/join", secret, body)
    assert response.status_code == 400
    assert response.json()["error"]["code"] in {"invalid_request", "invalid_peer_key"}
    assert not TrainingSession.objects.exists()


def test_not_json_at_all_is_a_400(client, run, secret):
    response = post(client, "/api/v1/runs/bengali-albert/join", secret, raw="{not json")
    assert response.status_code == 400


def test_join_needs_a_valid_token(client, run):
    response = client.post("/api/v1/runs/bengali-albert/join", data=json.dumps(join_body("bengali-albert")),
                           content_type="application/json")
    assert (response.status_code, response.json()["error"]["code"]) == (401, "token_missing")


def test_a_token_limited_to_another_run_cannot_join(client, run, volunteer):
    _, secret = token_create(user=volunteer, name="scoped", run=RunFactory())
    response = post(client, "/api/v1/runs/bengali-albert/join", secret, join_body("bengali-albert"))
    assert (response.status_code, response.json()["error"]["code"]) == (403, "token_out_of_scope")


def test_invite_only_runs_need_the_join_code_first(client, client_for, run, volunteer, secret):
    run.visibility = "invite"
    run.save()
    refused = post(client, "/api/v1/runs/bengali-albert/join", secret, join_body("bengali-albert"))
    assert (refused.status_code, refused.json()["error"]["code"]) == (403, "invite_only")
    client_for(volunteer).post(f"/runs/{run.slug}/join/", {"action": "code", "code": "wrong"})
    assert not RunMembership.objects.exists()
    client_for(volunteer).post(f"/runs/{run.slug}/join/", {"action": "code", "code": run.join_code})
    assert post(client, "/api/v1/runs/bengali-albert/join", secret, join_body("bengali-albert")).status_code == 200


def test_allowlisted_runs_admit_only_the_listed(client, run, organizer, volunteer, secret):
    run.visibility = "allowlist"
    run.save()
    listed = UserFactory(username="listed")
    run_allowlist_set(run=run, actor=organizer, usernames=["listed"])
    refused = post(client, "/api/v1/runs/bengali-albert/join", secret, join_body("bengali-albert"))
    assert refused.json()["error"]["code"] == "not_allowed"
    _, listed_secret = token_create(user=listed, name="x")
    assert post(client, "/api/v1/runs/bengali-albert/join", listed_secret, join_body("bengali-albert")).status_code == 200


def test_a_data_link_stops_working_for_a_banned_volunteer(client, run, organizer, volunteer, secret):
    data_file_add(run=run, actor=organizer, name="bn.txt", content=b"hello\n")
    url = post(client, "/api/v1/runs/bengali-albert/join", secret, join_body("bengali-albert")).json()["data_files"][0]
    run_ban(run=run, actor=organizer, user=volunteer)
    assert client.get(url.removeprefix("http://testserver")).status_code == 403
    assert client.get("/api/v1/data/forged-token/1.txt").status_code == 404


def test_the_access_token_lives_as_long_as_the_setting_says(client, run, secret, settings):
    settings.HIVEMIND_ACCESS_MINUTES = 5
    answer = post(client, "/api/v1/runs/bengali-albert/join", secret, join_body("bengali-albert")).json()
    session = TrainingSession.objects.get(pk=answer["session_id"])
    remaining = session.access_expires_at - session.started_at
    assert datetime.timedelta(minutes=4) < remaining <= datetime.timedelta(minutes=5, seconds=5)


@pytest.mark.parametrize("version, status, code", [
    ("0.15.3", 409, "agent_outdated"),  # serves no parameters alone: the validator could hold none of its states
    ("0.2.0", 409, "agent_outdated"),  # its membership proofs replace the gathered data: groups would refuse it
    ("0.1.0", 409, "agent_outdated"),  # before the share floor: it would split a group's vector otherwise
])
def test_an_agent_that_cannot_average_with_the_others_is_told_to_upgrade(client, run, secret, version, status, code):
    response = post(client, "/api/v1/runs/bengali-albert/join", secret, {**join_body("bengali-albert"), "agent_version": version})
    assert (response.status_code, response.json()["error"]["code"]) == (status, code)
    assert SWARM_COMPATIBLE_SINCE in response.json()["error"]["detail"]
    assert not TrainingSession.objects.exists()


@pytest.mark.parametrize("version", ["banana", "", "1.0 beta", "v1.0", "1!2.0", "1.0.0-rc1"])
def test_an_agent_version_that_is_not_a_version_number_is_refused_by_the_schema(client, run, secret, version):
    response = post(client, "/api/v1/runs/bengali-albert/join", secret, {**join_body("bengali-albert"), "agent_version": version})
    assert (response.status_code, response.json()["error"]["code"]) == (400, "invalid_request")
    assert response.json()["error"]["detail"].startswith("body.agent_version:")
    assert not TrainingSession.objects.exists()


def test_this_agent_and_newer_ones_may_join(client, run, secret):
    for version in (SWARM_COMPATIBLE_SINCE, __version__, "9.0.0"):
        body = {**join_body("bengali-albert"), "agent_version": version}
        response = post(client, "/api/v1/runs/bengali-albert/join", secret, body)
        assert response.status_code == 200, response.json()
    assert sorted(TrainingSession.objects.values_list("agent_version", flat=True)) == sorted(
        [SWARM_COMPATIBLE_SINCE, __version__, "9.0.0"])


def test_a_join_with_someone_elses_peer_key_is_refused(client, run, secret):
    """Peer keys are public (every signed DHT record names one): a join must prove it holds the key."""
    victim, thief = RSAPrivateKey(), RSAPrivateKey()
    stolen = join_body("bengali-albert", thief)
    stolen["peer_public_key"] = victim.get_public_key().to_bytes().decode()  # signed by the thief's own key
    response = post(client, "/api/v1/runs/bengali-albert/join", secret, stolen)
    assert (response.status_code, response.json()["error"]["code"]) == (403, "key_proof_invalid")
    unsigned = {key: value for key, value in join_body("bengali-albert", victim).items() if key not in ("key_proof",)}
    response = post(client, "/api/v1/runs/bengali-albert/join", secret, unsigned)
    assert (response.status_code, response.json()["error"]["code"]) == (400, "invalid_request")
    assert response.json()["error"]["detail"] == "body.key_proof: Field required"
    assert not TrainingSession.objects.exists()


def test_a_join_signed_for_another_run_or_long_ago_is_refused(client, run, secret):
    RunFactory(slug="other-run")
    key = RSAPrivateKey()
    response = post(client, "/api/v1/runs/bengali-albert/join", secret, join_body("other-run", key))
    assert (response.status_code, response.json()["error"]["code"]) == (403, "key_proof_invalid")
    old = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=6)
    message = join_proof_message(run="bengali-albert", peer_public_key=key.get_public_key().to_bytes().decode(), signed_at=old)
    replayed = {**join_body("bengali-albert", key), "signed_at": old.isoformat(), "key_proof": key.sign(message).decode()}
    response = post(client, "/api/v1/runs/bengali-albert/join", secret, replayed)
    assert (response.status_code, response.json()["error"]["code"]) == (403, "key_proof_stale")


def test_a_run_has_one_live_session_per_peer_key(client, run, secret):
    key = RSAPrivateKey()
    assert post(client, "/api/v1/runs/bengali-albert/join", secret, join_body("bengali-albert", key)).status_code == 200
    again = post(client, "/api/v1/runs/bengali-albert/join", secret, join_body("bengali-albert", key))
    assert (again.status_code, again.json()["error"]["code"]) == (409, "peer_key_in_use")
    TrainingSession.objects.update(ended_at=timezone.now())
    assert post(client, "/api/v1/runs/bengali-albert/join", secret, join_body("bengali-albert", key)).status_code == 200


def test_live_sessions_are_limited_per_token_and_per_volunteer(client, run, volunteer, secret, settings):
    settings.AGENT_TOKEN_MAX_LIVE_SESSIONS, settings.VOLUNTEER_MAX_LIVE_SESSIONS = 2, 3
    joins = [post(client, "/api/v1/runs/bengali-albert/join", secret, join_body("bengali-albert")) for _ in range(3)]
    assert [join.status_code for join in joins] == [200, 200, 429]
    assert joins[2].json()["error"]["code"] == "too_many_sessions"
    other = token_create(user=volunteer, name="desktop")[1]
    assert post(client, "/api/v1/runs/bengali-albert/join", other, join_body("bengali-albert")).status_code == 200
    refused = post(client, "/api/v1/runs/bengali-albert/join", other, join_body("bengali-albert"))
    assert (refused.status_code, refused.json()["error"]["code"]) == (429, "too_many_sessions"), "3 for the volunteer"
    # A crashed agent's session stops counting once it has been silent for two minutes.
    TrainingSession.objects.filter(token__name="laptop").update(last_seen_at=timezone.now() - datetime.timedelta(minutes=3))
    assert post(client, "/api/v1/runs/bengali-albert/join", secret, join_body("bengali-albert")).status_code == 200


def test_a_restarted_machine_replaces_its_previous_session_instead_of_counting_twice(client, run, volunteer, secret,
                                                                                    settings, outsider):
    """A notebook's kernel killed without notice, or a preempted VM, joins again as a new session naming the one
    its previous start held (issue 32): that one ends at once, even with one live session allowed per token,
    and only a session of the same token and run can be ended that way."""
    settings.AGENT_TOKEN_MAX_LIVE_SESSIONS = 1
    first = post(client, "/api/v1/runs/bengali-albert/join", secret, join_body("bengali-albert")).json()["session_id"]
    again = post(client, "/api/v1/runs/bengali-albert/join", secret, join_body("bengali-albert"))
    assert (again.status_code, again.json()["error"]["code"]) == (429, "too_many_sessions"), "a second machine"
    restart = post(client, "/api/v1/runs/bengali-albert/join", secret,
                   {**join_body("bengali-albert"), "replaces_session": first})
    assert restart.status_code == 200
    assert TrainingSession.objects.get(pk=first).ended_at is not None
    assert TrainingSession.objects.filter(ended_at=None).get().pk == restart.json()["session_id"]

    outsiders = token_create(user=outsider, name="theirs")[1]
    theirs = post(client, "/api/v1/runs/bengali-albert/join", outsiders,
                  {**join_body("bengali-albert"), "replaces_session": restart.json()["session_id"]})
    assert theirs.status_code == 200
    assert TrainingSession.objects.get(pk=restart.json()["session_id"]).ended_at is None, "not another's session"
    for bad in (0, -1, "one", 2**40):
        refused = post(client, "/api/v1/runs/bengali-albert/join", secret,
                       {**join_body("bengali-albert"), "replaces_session": bad})
        assert refused.status_code == 400 and "replaces_session" in refused.text
