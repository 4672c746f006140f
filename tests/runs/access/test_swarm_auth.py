"""Real hivemind DHTs on loopback: only peers holding a live token from the run's authority get in."""

import contextlib
import time
import uuid
from datetime import timedelta
from functools import partial

import psutil
import pytest
from hivemind.utils.crypto import RSAPrivateKey
from hivemind.utils.timed_storage import get_dht_time

from peer_agent.authorizer import PortalAuthorizer, expiration_parse
from tests.factories import RunAuthority
from tests.processes import processes_kill, running_dht

pytestmark = pytest.mark.swarm

HONEST_TOKEN_LIFETIME = timedelta(seconds=3)  # short, so the swarm refreshes tokens while the tests run
# Long enough for the banned peer to start and join before it runs out: on a loaded machine (load 30, CI10)
# p2pd's start and the first ping took more than 6 s, and a token that expired first was refused at bootstrap.
BANNED_TOKEN_LIFETIME = timedelta(seconds=20)


class CredulousAuthorizer(PortalAuthorizer):
    """A modified agent: presents whatever token it holds and trusts every peer's."""

    def is_token_valid(self, access_token):
        return True


def portal_for(authority, peer_key, username, lifetime):
    """Stands in for POST /api/v1/sessions/{id}/refresh; runs in the DHT process."""
    return lambda: authority.sign(peer_key, username=username, lifetime=lifetime)


def one_token_then_refusal(token):
    """A portal that issued ``token`` at join and refuses every refresh (the volunteer was banned)."""
    answers = [token]
    return lambda: answers.pop() if answers else None


@pytest.fixture(scope="module", autouse=True)
def no_leftover_children():
    before = {child.pid for child in psutil.Process().children(recursive=True)}
    yield
    leftovers = [
        child
        for child in psutil.Process().children(recursive=True)
        if child.pid not in before and child.name() != "torch_shm_manager"  # torch reuses it process-wide
    ]
    processes_kill(leftovers)


@pytest.fixture(scope="module")
def run_authority():
    return RunAuthority()


@pytest.fixture(scope="module")
def other_run_authority():
    return RunAuthority()


@pytest.fixture(scope="module")
def swarm(run_authority):
    """Two volunteers of the run, each with its own peer key and a portal that refreshes its token."""
    with contextlib.ExitStack() as stack:
        peers = []
        for username in ("volunteer", "organizer"):
            peer_key = RSAPrivateKey()
            fetch_token = portal_for(run_authority, peer_key, username, HONEST_TOKEN_LIFETIME)
            authorizer = PortalAuthorizer(peer_key, run_authority.public_key, fetch_token)
            initial_peers = peers[0].get_visible_maddrs() if peers else []
            peers.append(stack.enter_context(running_dht(authorizer=authorizer, initial_peers=initial_peers)))
        yield peers


def intruder(swarm, authorizer=None):
    return running_dht(authorizer=authorizer, initial_peers=swarm[0].get_visible_maddrs(), ensure_bootstrap_success=False)


def fresh_key(role):
    return f"{role}-{uuid.uuid4().hex}"


async def _routing_table_has(peer_id, _dht, node):
    return peer_id in node.protocol.routing_table


def assert_shut_out(swarm, outsider):
    """The swarm does not route to the outsider, nor share records with it in either direction."""
    expiration = get_dht_time() + 60
    swarm_key, outsider_key = fresh_key("swarm"), fresh_key("outsider")

    assert swarm[0].store(swarm_key, "members only", expiration)
    outsider.store(outsider_key, "spam", expiration)  # may "succeed" into its own local storage

    assert outsider.get(swarm_key, latest=True) is None
    assert all(peer.get(outsider_key, latest=True) is None for peer in swarm)
    assert not any(peer.run_coroutine(partial(_routing_table_has, outsider.peer_id)) for peer in swarm)


def test_volunteers_of_the_run_store_and_get_each_others_records(swarm):
    key = fresh_key("progress")

    assert swarm[0].store(key, "epoch 1", get_dht_time() + 60)

    assert swarm[1].get(key, latest=True).value == "epoch 1"


def test_volunteers_keep_access_as_their_short_tokens_are_refreshed(swarm):
    time.sleep(HONEST_TOKEN_LIFETIME.total_seconds() + 0.5)
    key = fresh_key("progress")

    assert swarm[1].store(key, "epoch 2", get_dht_time() + 60)

    assert swarm[0].get(key, latest=True).value == "epoch 2"


def test_peer_with_a_token_from_another_run_is_refused(swarm, other_run_authority):
    peer_key = RSAPrivateKey()
    fetch_token = portal_for(other_run_authority, peer_key, "outsider", timedelta(minutes=10))

    with intruder(swarm, CredulousAuthorizer(peer_key, other_run_authority.public_key, fetch_token)) as outsider:
        assert_shut_out(swarm, outsider)


def test_peer_with_an_expired_token_is_refused(swarm, run_authority):
    peer_key = RSAPrivateKey()
    fetch_token = portal_for(run_authority, peer_key, "outsider", timedelta(seconds=-5))

    with intruder(swarm, CredulousAuthorizer(peer_key, run_authority.public_key, fetch_token)) as outsider:
        assert_shut_out(swarm, outsider)


def test_peer_without_an_authorizer_is_refused(swarm):
    with intruder(swarm) as outsider:
        assert_shut_out(swarm, outsider)


@pytest.mark.parametrize("authorizer_class", [PortalAuthorizer, CredulousAuthorizer], ids=["agent", "modified-agent"])
def test_banned_volunteer_is_refused_once_its_token_expires(swarm, run_authority, authorizer_class):
    peer_key = RSAPrivateKey()
    token = run_authority.sign(peer_key, username="banned", lifetime=BANNED_TOKEN_LIFETIME)
    authorizer = authorizer_class(peer_key, run_authority.public_key, one_token_then_refusal(token))

    with running_dht(authorizer=authorizer, initial_peers=swarm[0].get_visible_maddrs()) as banned:
        key = fresh_key("before-ban")
        assert swarm[0].store(key, "still welcome", get_dht_time() + 60)
        assert banned.get(key, latest=True).value == "still welcome"
        assert swarm[0].run_coroutine(partial(_routing_table_has, banned.peer_id))

        time.sleep(max(0.0, expiration_parse(token["expiration_time"]) - get_dht_time()) + 0.5)
        # A peer sends its request before it can check the recipient's token, so one store may still
        # reach a modified agent; its refused answer drops it from the honest routing tables.
        for peer in swarm:
            peer.store(fresh_key("after-ban"), "probe", get_dht_time() + 60)

        assert_shut_out(swarm, banned)
