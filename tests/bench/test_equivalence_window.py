"""Which global steps ``bench/equivalence.py`` compares: only large-batch steps, from a state both
peers share. Checked on a hand-made record, no swarm."""

import torch

from bench.equivalence import Anomaly, PeerState, SwarmRecord

AGREE = 1e-6


def record_of(parameters: dict[int, tuple[float, float]], *, groups: dict[int, int] | None = None,
              anomalies: tuple[Anomaly, ...] = (), resyncs: tuple[int, ...] = ()) -> SwarmRecord:
    """A record whose peers enter each epoch with one parameter each (``parameters[epoch]``) and
    averaged in groups of 2 unless ``groups`` says otherwise."""
    def state(value: float) -> PeerState:
        return PeerState(parameters=[torch.tensor([value])], optimizer_state=[])

    snapshots = [{epoch: state(values[peer]) for epoch, values in parameters.items()} for peer in (0, 1)]
    sizes = {(peer, epoch): (groups or {}).get(epoch, 2) for epoch in parameters for peer in (0, 1)}
    return SwarmRecord(pool=None, snapshots=snapshots, anomalies=list(anomalies), group_sizes=sizes,
                       resyncs=list(resyncs))


def test_the_comparison_starts_at_the_first_agreement_after_settling():
    record = record_of({0: (1, 2), 1: (1, 1.5), 2: (1, 1.2), 3: (1, 1), 4: (1, 1), 5: (1, 1)})

    assert record.rough_epochs() == []
    assert record.comparable_start(settle=2, agree=AGREE) == 3


def test_a_round_missed_mid_run_moves_the_start_past_it_even_when_the_peers_still_agree():
    # The CI failure this guards: peer 0 downloaded the swarm's state in epoch 15 instead of
    # averaging; the parameters agreed again after it, but epoch 15 was no large-batch step.
    epochs = {epoch: (1, 1) for epoch in range(22)}
    missed = Anomaly(0, 15, "downloaded the swarm's state, dropping its gradients")
    record = record_of(epochs, anomalies=(missed,))

    assert record.rough_epochs() == [15]
    assert record.comparable_start(settle=2, agree=AGREE) == 16


def test_a_group_without_the_other_peer_is_a_rough_round():
    record = record_of({epoch: (1, 1) for epoch in range(10)}, groups={6: 1})

    assert record.rough_epochs() == [6]
    assert record.comparable_start(settle=2, agree=AGREE) == 7


def test_the_last_round_while_the_peers_stop_does_not_count():
    epochs = {epoch: (1, 1) for epoch in range(10)}
    stopping = Anomaly(1, 9, "joined an averaging round with zero weight")  # epoch 9 is not completed by both
    record = record_of(epochs, anomalies=(stopping,))

    assert record.rough_epochs() == []
    assert record.comparable_start(settle=2, agree=AGREE) == 2


def test_peers_that_never_averaged_together_give_no_comparison():
    record = record_of({epoch: (1, 1) for epoch in range(10)}, groups=dict.fromkeys(range(2, 10), 1))

    assert record.comparable_start(settle=2, agree=AGREE) is None
