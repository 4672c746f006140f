"""The coordinator's backbone peer: its addresses become the run's initial peers; it keeps its
peer id across restarts; agents holding portal tokens bootstrap from it. A run may have several,
one holding the run's duties until its coordinator dies."""

import datetime
import json
import time

import pytest
from django.conf import settings as django_settings
from hivemind.utils.crypto import RSAPrivateKey

from harness.processes import children_reap
from peer_agent.authorizer import PortalAuthorizer, rsa_public_key_parse
from peer_agent.reachability import reachability_probe
from runs.access.authority import access_token_sign, authority_load
from runs.models import Backbone
from runs.swarm.coordinator import Coordinator
from tests.e2e.agents import backbone_kill
from tests.factories import RunFactory
from tests.processes import running_dht

pytestmark = [pytest.mark.swarm, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def coordinator(settings, tmp_path):
    settings.COORDINATOR_STATE_DIR = str(tmp_path / "coordinator")
    coordinators = []

    def make(state_dir=None) -> Coordinator:
        coordinators.append(Coordinator(interval=0.1, state_dir=state_dir))
        return coordinators[-1]

    yield make
    for made in coordinators:
        for peer in made.peers.values():
            peer.shutdown()
    children_reap()


def volunteer_authorizer(run, username="vik"):
    authority = authority_load(encrypted=run.authority_private_key, secret=django_settings.AUTHORITY_ENCRYPTION_KEY)
    key = RSAPrivateKey()
    public = key.get_public_key().to_bytes()
    fetch = lambda: access_token_sign(  # noqa: E731
        private_key=authority, username=username, peer_public_key=public, lifetime=datetime.timedelta(minutes=5)
    )
    return PortalAuthorizer(key, rsa_public_key_parse(run.authority_public_key), fetch)


def test_active_runs_get_a_backbone_peer_whose_addresses_agents_bootstrap_from(coordinator):
    run = RunFactory(status="active")
    draft = RunFactory(status="draft")
    first = coordinator()
    first.sync()
    run.refresh_from_db()
    draft.refresh_from_db()
    assert run.initial_peers and run.initial_peers[0].startswith("/ip4/127.0.0.1/tcp/")
    assert run.coordinator_heartbeat_at is not None
    assert draft.initial_peers == []

    with running_dht(initial_peers=run.initial_peers, authorizer=volunteer_authorizer(run)) as agent:
        assert agent.store("greeting", "hello", expiration_time=time.time() + 60)
        assert agent.get("greeting").value == "hello"
    # It relays and dials agents back (peer_agent/reachability.py): one on loopback is reachable directly.
    reach = reachability_probe(run.initial_peers, host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    assert reach.path == "direct", reach

    peer_id = run.coordinator_peer_id
    run.status = "finished"
    run.save()
    first.sync()
    assert first.peers == {}, "a finished run's peer is let go"

    run.status = "active"
    run.save()
    second = coordinator()
    second.sync()
    run.refresh_from_db()
    assert run.coordinator_peer_id == peer_id, "a restarted coordinator keeps its peer id"


def test_a_backbone_peer_whose_remembered_peers_are_all_gone_starts_a_fresh_swarm_and_forgets_them(coordinator):
    run = RunFactory(status="active")
    with running_dht() as departed:  # the last agent the backbone peer was connected to, gone since
        dead_addresses = [str(maddr) for maddr in departed.get_visible_maddrs()]
    state = coordinator().state_dir
    state.mkdir(parents=True)
    swarm_file = state / f"{run.hivemind_run_id}.swarm"
    swarm_file.write_text(json.dumps(dead_addresses))

    restarted = coordinator()
    restarted.sync()
    run.refresh_from_db()
    assert restarted.peers[run.pk].dht.is_alive()
    assert run.initial_peers and set(run.initial_peers).isdisjoint(dead_addresses)
    assert not swarm_file.exists() or json.loads(swarm_file.read_text()) != dead_addresses
    with running_dht(initial_peers=run.initial_peers, authorizer=volunteer_authorizer(run)) as agent:
        assert agent.store("greeting", "hello", expiration_time=time.time() + 60)


def test_a_stopped_backbone_peer_withdraws_its_addresses_from_the_run(coordinator):
    run = RunFactory(status="active")
    serving = coordinator()
    serving.sync()
    serving.peers.pop(run.pk).shutdown()
    run.refresh_from_db()
    assert run.initial_peers == []


def test_a_second_backbone_peer_joins_the_first_and_takes_the_duties_over_when_the_first_dies(coordinator, settings,
                                                                                               tmp_path):
    settings.COORDINATOR_HEARTBEAT_STALE_SECONDS = 3
    # Longer than the first checkpointer tick takes here (it imports the model's libraries).
    settings.COORDINATOR_DUTIES_LEASE_SECONDS = 30
    run = RunFactory(status="active")
    first = coordinator()
    first.sync()
    second = coordinator(state_dir=tmp_path / "second-host")
    second.sync()
    first.sync()
    run.refresh_from_db()
    one, two = first.peers[run.pk], second.peers[run.pk]
    assert one.peer_id != two.peer_id
    assert run.initial_peers == one.maddrs + two.maddrs, "every join names both, the older first"
    assert run.coordinator_peer_id == one.peer_id and one.holds_duties and not two.holds_duties
    # The second entered the first's swarm: a volunteer who knows only the second reaches what the first holds.
    assert one.dht.store("greeting", "hello", expiration_time=time.time() + 60)
    with running_dht(initial_peers=two.maddrs, authorizer=volunteer_authorizer(run)) as agent:
        assert agent.get("greeting", latest=True).value == "hello"

    # The first host dies without a word (SIGKILL): nothing withdraws its addresses or its duties.
    backbone_kill(first)
    second.sync()
    run.refresh_from_db()
    assert run.coordinator_peer_id == one.peer_id and not two.holds_duties, "the first's lease has not lapsed yet"
    deadline = time.monotonic() + 60
    while not two.holds_duties:
        assert time.monotonic() < deadline, "the second never took the duties over"
        time.sleep(0.5)
        second.sync()
    run.refresh_from_db()
    assert run.coordinator_peer_id == two.peer_id
    assert run.initial_peers == two.maddrs, "joins stop naming the dead peer once its heartbeat is stale"
    assert list(Backbone.objects.filter(run=run).values_list("peer_id", flat=True)) == [one.peer_id, two.peer_id], \
        "the health page still shows the dead one, as silent"
