"""One peer of a real swarm sends sign-flipped gradients, 100 times their size: with the mean the
honest peers' loss stops falling, with CenteredClip it goes on falling (peer_agent/aggregation.py)."""

import pytest

from harness.swarm import train_together
from peer_agent.aggregation import RUNNERS

pytestmark = [pytest.mark.swarm, pytest.mark.timeout(300), pytest.mark.usefixtures("reap_children", "torch_threads")]

EPOCHS = 6


def poison(trainer, factor: float = -100.0) -> None:
    """Make ``trainer`` an attacker: what it hands to the all-reduce is its gradient times ``factor``
    (after its own clipping, which an attacker would not do)."""
    step = trainer.optimizer.step

    def poisoned_step(*args, **kwargs):
        for parameter in trainer.model.parameters():
            if parameter.grad is not None:
                parameter.grad.mul_(factor)
        return step(*args, **kwargs)

    trainer.optimizer.step = poisoned_step


def loss_drop(results) -> float:
    """How much the mean loss of the first five steps exceeds that of the last five, over the peers."""
    early = sum(sum(result.loss for result in peer[:5]) for peer in results) / (5 * len(results))
    late = sum(sum(result.loss for result in peer[-5:]) for peer in results) / (5 * len(results))
    return early - late


@pytest.mark.parametrize("aggregation", ["mean", "centered_clip"])
def test_an_attacker_derails_the_mean_but_not_centered_clip(make_trainer, aggregation):
    # Each peer gathers about 40 samples an epoch: enough that honest gradients agree in direction.
    options = dict(averaging=dict(aggregation=aggregation), training=dict(target_batch_size=128))
    first = make_trainer(seed=1, **options)
    second = make_trainer(seed=2, joins=first, **options)
    attacker = make_trainer(seed=3, joins=first, **options)
    for averager in (first.optimizer.grad_averager, first.optimizer.state_averager):
        assert averager._runner_class is RUNNERS[aggregation], "gradients and parameters are combined alike"
    poison(attacker)

    results = train_together([first, second, attacker], epochs=EPOCHS)

    drop = loss_drop(results[:2])
    if aggregation == "mean":
        assert drop < 0.05, f"the attack works on the mean: honest loss changed by {-drop:+.3f}"
    else:
        assert drop > 0.1, f"with CenteredClip the honest loss falls: it changed by {-drop:+.3f}"
