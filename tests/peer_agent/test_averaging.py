"""The agent's gradient averager keeps a slow peer's share above 0 (peer_agent.averaging)."""

import json
import threading

import pytest
import torch
from hivemind.averaging.allreduce import AllReduceRunner, AveragingMode
from hivemind.averaging.load_balancing import load_balance_peers

from peer_agent import aggregation
from peer_agent.averaging import MIN_SHARE, FlooredGradientAverager, _ahead_in_round, shares_with_floor
from tests.processes import loopback_dhts

pytestmark = pytest.mark.timeout(180)



def test_hivemind_gives_a_slow_peer_no_share_and_the_floor_gives_it_one():
    elements = 5_000_000
    parts = load_balance_peers(elements, [100.0, 100.0, 100.0, 20.0])
    assert parts[3] == 0
    floored = shares_with_floor(parts, [True] * 4)
    assert sum(floored) == elements
    assert floored[3] == pytest.approx(MIN_SHARE * elements, abs=1)
    assert floored[0] == pytest.approx((elements - floored[3]) / 3, abs=1), "the fast peers give up equal parts"


def test_a_firewalled_peer_keeps_no_share_and_large_shares_are_left_alone():
    parts = (1_700_000, 1_700_000, 1_600_000, 0)
    assert shares_with_floor(parts, [True, True, True, False]) == parts
    assert shares_with_floor((40, 30, 30), [True, True, True]) == (40, 30, 30)


def test_a_floor_that_cannot_be_met_by_every_peer_changes_nothing():
    assert shares_with_floor((100, 0, 0), [True, True, True], floor=0.5) == (100, 0, 0)


def test_peers_average_correctly_with_a_slow_peer_given_a_share(monkeypatch, tmp_path):
    """Three peers on loopback, one declaring 20 Mbit/s against 100 (hivemind's LP: share 0)."""
    record = tmp_path / "partitions.jsonl"

    class RecordingRunner(AllReduceRunner):
        """Writes down the partition each averager (a child process) runs its round with."""

        def __init__(self, *args, peer_fractions, **kwargs):
            with record.open("a") as file:
                file.write(json.dumps(list(peer_fractions)) + "\n")
            super().__init__(*args, peer_fractions=peer_fractions, **kwargs)

    monkeypatch.setitem(aggregation.RUNNERS, "mean", RecordingRunner)  # read as each averager is made
    bandwidths = [100.0, 100.0, 20.0]
    dhts = loopback_dhts(len(bandwidths))
    parameters = [[torch.zeros(64, 33, requires_grad=True)] for _ in bandwidths]
    for index, (parameter,) in enumerate(parameters):
        parameter.grad = torch.full_like(parameter, float(index))
    averagers = [
        FlooredGradientAverager(params, dht=dht, prefix="test_floor", start=True, bandwidth=bandwidth,
                                target_group_size=3, min_matchmaking_time=2.0, request_timeout=1.0, warn=False)
        for params, dht, bandwidth in zip(parameters, dhts, bandwidths)
    ]
    try:
        groups = [None] * len(averagers)

        def average(index: int) -> None:
            averagers[index].accumulate_grads_(batch_size=1)
            groups[index] = averagers[index].step(timeout=60)

        threads = [threading.Thread(target=average, args=(index,)) for index in range(len(averagers))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(90)
        assert all(group is not None and len(group) == 3 for group in groups), groups
        partitions = [tuple(json.loads(line)) for line in record.read_text().splitlines()]
        assert len(set(partitions)) == 1 and len(partitions) == 3, f"every peer partitions alike: {partitions}"
        assert min(partitions[0]) >= MIN_SHARE * sum(partitions[0]), partitions[0]
        for averager in averagers:
            with averager.get_tensors() as (averaged,):
                assert torch.allclose(averaged, torch.full_like(averaged, 1.0)), "the mean of 0, 1 and 2"
    finally:
        for averager in averagers:
            averager.shutdown()
        for dht in dhts:
            dht.shutdown()


def test_an_auxiliary_peer_reduces_the_largest_part_and_adds_nothing_to_the_mean(monkeypatch, tmp_path):
    """Two volunteers at 20 Mbit/s and an aggregator (hivemind's auxiliary mode) at 500: the LP gives the
    aggregator most of the vector; it sends no vector of its own, so the mean is the volunteers' alone."""
    record = tmp_path / "partitions.jsonl"

    class RecordingRunner(AllReduceRunner):
        def __init__(self, *args, peer_fractions, modes=None, **kwargs):
            with record.open("a") as file:
                file.write(json.dumps([list(peer_fractions), [mode.value for mode in modes or ()]]) + "\n")
            super().__init__(*args, peer_fractions=peer_fractions, modes=modes, **kwargs)

    monkeypatch.setitem(aggregation.RUNNERS, "mean", RecordingRunner)
    bandwidths, auxiliary = [20.0, 20.0, 500.0], [False, False, True]
    dhts = loopback_dhts(len(bandwidths))
    parameters = [[torch.zeros(64, 33, requires_grad=True)] for _ in bandwidths]
    for index, (parameter,) in enumerate(parameters):
        parameter.grad = torch.full_like(parameter, 100.0 if auxiliary[index] else float(index))
    averagers = [
        FlooredGradientAverager(params, dht=dht, prefix="test_aux", start=True, bandwidth=bandwidth, auxiliary=aux,
                                target_group_size=3, min_matchmaking_time=2.0, request_timeout=1.0, warn=False)
        for params, dht, bandwidth, aux in zip(parameters, dhts, bandwidths, auxiliary)
    ]
    try:
        groups = [None] * len(averagers)

        def average(index: int) -> None:
            if not auxiliary[index]:
                averagers[index].accumulate_grads_(batch_size=1)
            groups[index] = averagers[index].step(timeout=60)

        threads = [threading.Thread(target=average, args=(index,)) for index in range(len(averagers))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(90)
        assert all(group is not None and len(group) == 3 for group in groups), groups
        rounds = [json.loads(line) for line in record.read_text().splitlines()]
        assert len(rounds) == 3 and all(entry == rounds[0] for entry in rounds), f"every peer partitions alike: {rounds}"
        fractions, modes = rounds[0]
        order = [str(peer_id) for peer_id in groups[0]]
        aux_index = order.index(str(dhts[2].peer_id))
        assert modes[aux_index] == AveragingMode.AUX.value and modes.count(AveragingMode.AUX.value) == 1
        assert fractions[aux_index] > 0.5 * sum(fractions), f"the fast aggregator takes the largest part: {fractions}"
        assert min(fractions) >= MIN_SHARE * sum(fractions), "the volunteers keep the floor"
        for averager, aux in zip(averagers, auxiliary):
            if not aux:
                with averager.get_tensors() as (averaged,):
                    assert torch.allclose(averaged, torch.full_like(averaged, 0.5)), "the mean of 0 and 1, not of 100"
    finally:
        for averager in averagers:
            averager.shutdown()
        for dht in dhts:
            dht.shutdown()


@pytest.mark.parametrize(("gathered", "ahead"), [
    ([7, 8], 8),  # a round of two epochs: the peer behind takes the swarm's
    ([7, 8, 8], 8),
    ([7, 7, 8], 8),  # half the others: a liar in a round of three is as good as an honest member
    ([7, 8, 1007], 8),  # a liar's far claim does not hide an honest member's
    ([7, 7, 7, 8], None),  # one member's claim moves no peer whose round holds two others
    ([7, 7, 1007], None),  # a far epoch is hivemind's tracker's to find
    ([7, 1007], None),
    ([7, 7], None),
    ([7, None, 8], 8),  # an aggregator gathers no epoch
    ([7, True, 8], 8),
])
def test_a_round_moves_a_peer_to_the_next_epoch_only_when_half_the_others_are_there(gathered, ahead):
    assert _ahead_in_round({f"peer{index}": value for index, value in enumerate(gathered)}, 7) == ahead
