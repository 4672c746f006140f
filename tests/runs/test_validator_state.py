"""The validator holds an epoch's parameters only when two downloads of the swarm's state agree
(runs/swarm/spotcheck.py): a state caught between a peer's new epoch and its optimizer step, or a
peer that stepped on its own gradients, would fail every honest check of the epoch (docs/trust.md)."""

import pytest
import torch

from runs.swarm.spotcheck import STATE_AGREEMENT, Validator, parameters_apart


class Downloads:
    """The checkpointer's ``state_download`` answering with given states in turn. A real swarm
    cannot be made to serve a state in the moment between a peer's epoch count and its optimizer
    step on cue; tests/e2e/test_spot_checks_with_agents.py runs the validator on real downloads."""

    def __init__(self, *states) -> None:
        self.states = list(states)

    def state_download(self, *, swarm_epoch: int, timeout: float = 0.0):
        epoch, parameters = self.states.pop(0)
        return epoch, [parameter.clone() for parameter in parameters], "the run's tokenizer"


def model_parameters(seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(64, 32, generator=generator), torch.randn(32, generator=generator)]


def one_lamb_step(parameters: list[torch.Tensor], rate: float) -> list[torch.Tensor]:
    """Each tensor moved by ``rate`` times its norm, in a random direction: LAMB's step."""
    generator = torch.Generator().manual_seed(99)
    moved = []
    for parameter in parameters:
        direction = torch.randn(parameter.shape, generator=generator)
        moved.append(parameter + rate * parameter.norm() * direction / direction.norm())
    return moved


def validator(*states) -> Validator:
    return Validator(run_pk=1, run_id="run", slug="run", dht=None, checkpointer=Downloads(*states))


def test_two_agreeing_downloads_are_held_by_their_epoch():
    parameters = model_parameters(0)
    through_fp16 = [parameter.half().float() for parameter in parameters]  # how states travel
    checks = validator((7, parameters), (7, through_fp16))
    checks._hold(7)
    assert list(checks.held) == [7]
    assert all(torch.equal(held, sent) for held, sent in zip(checks.held[7], through_fp16, strict=True))


OLD = model_parameters(0)


@pytest.mark.parametrize("first, second", [
    ((8, OLD), (8, one_lamb_step(OLD, rate=0.00176))),  # the first came between the epoch count and the step
    ((7, OLD), (8, OLD)),  # the swarm moved on between the downloads
    ((7, OLD), (7, one_lamb_step(OLD, rate=0.06))),  # two peers that stepped apart (a failed round)
    ((9, OLD), (9, OLD)),  # past the swarm's epoch 7 (runs/swarm/checkpoints.py: state_epoch_trusted)
], ids=["new-epoch-old-parameters", "two-epochs", "stepped-apart", "past-the-swarm"])
def test_a_state_the_downloads_disagree_on_or_past_the_swarm_is_not_held(first, second):
    checks = validator(first, second)
    checks._hold(7)
    assert checks.held == {}


def test_parameters_apart_measures_the_relative_distance():
    parameters = model_parameters(1)
    assert parameters_apart(parameters, parameters) == 0.0
    assert parameters_apart([parameter.half().float() for parameter in parameters], parameters) < STATE_AGREEMENT / 2
    assert 0.0015 < parameters_apart(one_lamb_step(parameters, rate=0.00176), parameters) < 0.002
