"""CenteredClip on the parts of hivemind's all-reduce: agreeing peers keep their average, one peer
sending a huge or sign-flipped gradient moves the result little."""

import asyncio
import functools
import threading

import pytest
import torch
from hivemind.averaging.partition import TensorPartReducer

from peer_agent.aggregation import CenteredClipReducer, centered_clip
from peer_agent.protocol import AveragingConfig


def honest_slices(count: int, *, size: int = 1000, spread: float = 0.1, seed: int = 0) -> list[torch.Tensor]:
    """Gradients of different batches: one direction and some noise each."""
    generator = torch.Generator().manual_seed(seed)
    direction = torch.randn(size, generator=generator)
    return [direction + spread * torch.randn(size, generator=generator) for _ in range(count)]


def test_identical_slices_come_back_unchanged():
    slice_ = torch.linspace(-1, 1, 50)
    assert torch.allclose(centered_clip([slice_] * 4, [1.0] * 4), slice_)


def test_two_peers_of_one_norm_get_their_weighted_mean():
    a, b = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])
    assert torch.allclose(centered_clip([a, b], [1.0, 3.0]), torch.tensor([0.25, 0.75]))


def test_an_attacker_left_alone_with_one_honest_slice_cannot_outweigh_it():
    # A part has two slices when the third sender timed out: no majority, and the plain mean would
    # be 49.5 times the flipped gradient.
    honest = honest_slices(1)[0]
    robust = centered_clip([honest, -100 * honest], [1.0, 1.0])
    assert robust.norm() <= 1e-4 * honest.norm()
    assert torch.allclose(centered_clip([honest, 0.5 * honest], [1.0, 1.0]), 0.5 * honest)


def test_a_zero_weight_slice_sets_no_bound():
    honest = honest_slices(1)[0]
    assert torch.allclose(centered_clip([honest, torch.zeros_like(honest)], [1.0, 0.0]), honest)


@pytest.mark.parametrize("attack", ["sign_flip_x100", "noise_x10"])
def test_one_attacker_in_four_barely_moves_the_result(attack):
    honest = honest_slices(3)
    mean = torch.stack(honest).mean(0)
    noise = torch.randn(1000, generator=torch.Generator().manual_seed(3))  # seeded: the same attack on every run
    bad = -100 * honest[0] if attack == "sign_flip_x100" else 10 * mean.norm() * noise / 1000 ** 0.5
    slices = [*honest, bad]

    plain = torch.stack(slices).mean(0)
    robust = centered_clip(slices, [1.0] * 4)

    assert (plain - mean).norm() > 2 * mean.norm(), "the plain mean is derailed"
    assert (robust - mean).norm() < 0.1 * mean.norm(), "CenteredClip stays with the honest peers"


def test_without_an_attacker_it_stays_close_to_the_mean():
    slices = honest_slices(4)
    mean = torch.stack(slices).mean(0)
    assert (centered_clip(slices, [1.0] * 4) - mean).norm() < 0.02 * mean.norm()


def test_two_slices_of_parameters_leave_the_part_to_its_owner():
    # In the state all-reduce a slice of zeros would cut the owner's parameters to zero.
    owner = honest_slices(1)[0]
    assert torch.equal(centered_clip([torch.zeros_like(owner), owner], [1.0, 1.0], own=1), owner)
    assert torch.equal(centered_clip([owner], [1.0], own=0), owner)
    three = [owner, owner + 0.01, torch.zeros_like(owner)]
    assert torch.equal(centered_clip(three, [1.0] * 3, own=0), centered_clip(three, [1.0] * 3)), "a majority decides"


def reduce_parts(reducer_class, slices_by_sender: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    """What hivemind's all-reduce does with a part reducer: each sender hands in its slice of each part
    in order, concurrently, and receives the combined part."""
    shapes = tuple(part.shape for part in slices_by_sender[0])

    async def run():
        reducer = reducer_class(shapes, len(slices_by_sender))

        async def sender(index: int) -> list[torch.Tensor]:
            return [await reducer.accumulate_part(index, part_index, part.clone(), weight=1.0)
                    for part_index, part in enumerate(slices_by_sender[index])]

        results = await asyncio.gather(*(sender(index) for index in range(len(slices_by_sender))))
        reducer.finalize()
        return results[0]

    return asyncio.run(run())


def test_the_reducer_combines_every_part_as_hivemind_hands_them_in():
    honest = [honest_slices(3, size=600, seed=seed) for seed in (1, 2)]  # two parts, three honest senders each
    senders = [[honest[0][i], honest[1][i]] for i in range(3)]
    senders.append([-100 * honest[0][0], -100 * honest[1][0]])

    plain = reduce_parts(TensorPartReducer, senders)
    robust = reduce_parts(CenteredClipReducer, senders)

    for part, clipped, averaged in zip(honest, robust, plain):
        mean = torch.stack(part).mean(0)
        assert (averaged - mean).norm() > 5 * mean.norm()
        assert torch.allclose(clipped, centered_clip([*part, -100 * part[0]], [1.0] * 4))
        assert (clipped - mean).norm() < 0.1 * mean.norm()


def test_the_parameters_reducer_keeps_the_owners_slice_where_an_attacker_sends_zeros():
    owner = honest_slices(2, size=600, seed=4)  # two parts; the owner is the second sender
    senders = [[torch.zeros_like(part) for part in owner], owner]

    gradients = reduce_parts(CenteredClipReducer, senders)
    parameters = reduce_parts(functools.partial(CenteredClipReducer, own_sender=1), senders)

    assert all(part.norm() == 0 for part in gradients), "a gradient part is cancelled for the round"
    assert all(torch.equal(kept, part) for kept, part in zip(parameters, owner)), "parameters are the owner's"


def test_a_run_chooses_its_aggregation_and_mean_is_the_default():
    assert AveragingConfig().aggregation == "mean"
    assert AveragingConfig(aggregation="centered_clip").aggregation == "centered_clip"
    with pytest.raises(ValueError):
        AveragingConfig(aggregation="median")


def test_in_a_real_round_of_two_the_owners_keep_their_parameters_and_the_attackers_zeros_stay_its_own():
    """Two averagers of parameters on loopback, combining by CenteredClip; one sends zeros."""
    from hivemind.averaging import DecentralizedAverager

    from peer_agent.aggregation import PARAMETERS_RUNNERS, AggregatingAverager
    from tests.processes import loopback_dhts

    class ParametersAverager(AggregatingAverager):
        runners = PARAMETERS_RUNNERS

    assert issubclass(ParametersAverager, DecentralizedAverager)
    # Two of hivemind's parts (DEFAULT_PART_SIZE_BYTES, 2**19: 131,072 values), one owned by each peer.
    honest = honest_slices(1, size=2 * 131_072, seed=5)[0]
    dhts = loopback_dhts(2)
    averagers = [ParametersAverager([tensor.clone()], dht=dht, prefix="test_owner", start=True, target_group_size=2,
                                    bandwidth=100.0, min_matchmaking_time=2.0, request_timeout=1.0,
                                    aggregation="centered_clip")
                 for tensor, dht in zip((honest, torch.zeros_like(honest)), dhts)]
    try:
        groups = [None, None]

        def average(index: int) -> None:
            groups[index] = averagers[index].step(timeout=60)

        threads = [threading.Thread(target=average, args=(index,)) for index in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(90)
        assert all(group is not None and len(group) == 2 for group in groups), groups
        results = []
        for averager in averagers:
            with averager.get_tensors() as (averaged,):
                results.append(averaged.clone())
        assert torch.equal(results[0], results[1]), "both leave the round with the same parameters"
        kept, zeroed = results[0] == honest, results[0] == 0
        assert bool((kept | zeroed).all()), "each part is its owner's slice"
        assert kept.float().mean().item() == 0.5, "the honest peer's part kept, the attacker's as it chose"
    finally:
        for averager in averagers:
            averager.shutdown()
        for dht in dhts:
            dht.shutdown()
