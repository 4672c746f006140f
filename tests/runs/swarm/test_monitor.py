"""The monitor reads a peer's signed records from a real DHT on loopback: the run's series, each
closed epoch judged against the session's reports (also epochs it never polled in), and nothing
judged twice after a restart."""

from dataclasses import dataclass

import pytest
from django.utils import timezone
from hivemind.dht import DHT
from hivemind.dht.schema import SchemaValidator
from hivemind.optim.progress_tracker import LocalTrainingProgress, TrainingProgressSchema
from hivemind.utils.crypto import RSAPrivateKey
from hivemind.utils.timed_storage import get_dht_time

from harness.processes import children_reap
from peer_agent.metrics import LocalMetrics, metrics_publish, metrics_validators, owner_subkey
from runs.models import Run, RunSample, SessionEpoch, TrainingSession
from runs.swarm.monitor import Monitor, progress_key
from tests.factories import RunFactory
from tests.processes import running_dht
from tests.runs.epochs import report, session_for

pytestmark = [pytest.mark.swarm, pytest.mark.django_db(transaction=True)]


class Peer:
    """Publishes one peer's signed progress and metrics records, as an agent's trainer does."""

    def __init__(self, dht, run_id: str, key: RSAPrivateKey) -> None:
        self.dht, self.run_id, self.key = dht, run_id, key

    def progress(self, epoch: int, samples: int) -> None:
        record = LocalTrainingProgress(peer_id=self.dht.peer_id.to_bytes(), epoch=epoch, samples_accumulated=samples,
                                       samples_per_second=8.0, time=get_dht_time(), client_mode=False)
        assert self.dht.store(progress_key(self.run_id), subkey=owner_subkey(self.key), value=record.dict(),
                              expiration_time=get_dht_time() + 60)

    def epoch_ended(self, new_epoch: int, samples: int, closed_epochs=()) -> None:
        metrics = LocalMetrics(step=new_epoch, samples_per_second=8.0, samples_accumulated=samples, loss=5.0, mini_steps=2,
                               closed_epochs=list(closed_epochs))
        assert metrics_publish(self.dht, self.run_id, self.key, metrics).result()
        self.progress(new_epoch, 0)


def statuses(session):
    return {row.epoch: (row.status, row.reported_samples, row.announced_samples)
            for row in SessionEpoch.objects.filter(session=session)}


@dataclass
class Swarm:
    run: Run
    amina: TrainingSession  # the session whose peer publishes
    peer: Peer
    backbone: DHT  # the coordinator's


@pytest.fixture
def swarm():
    """A run, a session, its peer's DHT publishing signed records and the backbone the monitor reads."""
    run = RunFactory()
    key = RSAPrivateKey()
    amina = session_for(run)
    amina.peer_public_key = key.get_public_key().to_bytes().decode()
    amina.save()
    validators = [SchemaValidator(TrainingProgressSchema, prefix=run.hivemind_run_id),
                  *metrics_validators(run.hivemind_run_id, key)]
    try:
        with running_dht(record_validators=metrics_validators(run.hivemind_run_id)) as backbone, \
                running_dht(initial_peers=backbone.get_visible_maddrs(), record_validators=validators) as agent_dht:
            yield Swarm(run, amina, Peer(agent_dht, run.hivemind_run_id, key), backbone)
    finally:
        children_reap()


def test_the_monitor_judges_closed_epochs_from_signed_records_and_a_restart_judges_nothing_twice(swarm):
    run, amina, peer, backbone = swarm.run, swarm.amina, swarm.peer, swarm.backbone
    report(amina, 16, epoch=0)
    report(amina, 40, epoch=1)  # reports more than its peer trained
    monitor = Monitor(dht=backbone, run_pk=run.pk, run_id=run.hivemind_run_id, grace_s=0)
    peer.progress(0, 8)
    peer.progress(0, 16)
    reading = monitor.poll()
    assert (reading.global_epoch, reading.alive_peers, reading.samples_accumulated) == (0, 1, 16)
    assert statuses(amina) == {}, "an open epoch is not judged"
    # The validator names a peer by its libp2p id; the signed record names the session's (runs/swarm/spotcheck.py).
    assert monitor.peer_session(str(peer.dht.peer_id)) == amina.pk
    assert monitor.peer_session(str(backbone.peer_id)) is None

    peer.progress(1, 8)  # the monitor misses the last progress of epoch 1: the metrics record has it
    monitor.poll()
    peer.epoch_ended(2, samples=20, closed_epochs=[(0, 16), (1, 20)])
    monitor.poll()
    assert statuses(amina) == {0: ("verified", 16, 16), 1: ("flagged", 40, 20)}
    judged_at = dict(SessionEpoch.objects.values_list("epoch", "checked_at"))

    restarted = Monitor(dht=backbone, run_pk=run.pk, run_id=run.hivemind_run_id, grace_s=0)
    peer.progress(2, 8)
    restarted.poll()
    restarted.poll()
    assert dict(SessionEpoch.objects.values_list("epoch", "checked_at")) == judged_at, "nothing judged twice"

    report(amina, 8, epoch=2)
    peer.epoch_ended(3, samples=8, closed_epochs=[(0, 16), (1, 20), (2, 8)])
    restarted.poll()
    assert statuses(amina)[2] == ("verified", 8, 8), "the restarted monitor goes on judging"
    series = list(RunSample.objects.filter(run=run).values_list("global_epoch", "alive_peers"))
    assert series == [(0, 1), (1, 1), (2, 1), (2, 1), (2, 1), (3, 1)]
    assert RunSample.objects.filter(run=run).latest("at").at <= timezone.now()


def test_epochs_between_two_polls_are_judged_from_the_counts_the_peer_names(swarm):
    """A busy coordinator (a slow cycle, a locked database) may not poll for several epochs; the
    peer's metrics record names its last epochs' counts, so none is judged on a partial figure."""
    for epoch, samples in enumerate((16, 32, 24)):
        report(swarm.amina, samples, epoch=epoch)
    monitor = Monitor(dht=swarm.backbone, run_pk=swarm.run.pk, run_id=swarm.run.hivemind_run_id, grace_s=0)
    swarm.peer.progress(0, 8)
    monitor.poll()
    swarm.peer.epoch_ended(1, 16, closed_epochs=[(0, 16)])
    swarm.peer.epoch_ended(2, 32, closed_epochs=[(0, 16), (1, 32)])
    swarm.peer.epoch_ended(3, 24, closed_epochs=[(0, 16), (1, 32), (2, 24)])
    monitor.poll()
    assert statuses(swarm.amina) == {0: ("verified", 16, 16), 1: ("verified", 32, 32), 2: ("verified", 24, 24)}
