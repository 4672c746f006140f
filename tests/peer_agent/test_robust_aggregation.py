"""One peer of a real swarm sends sign-flipped gradients, 100 times their size: with the mean the
honest peers' loss stops falling, with CenteredClip it goes on falling (peer_agent/aggregation.py)."""

import pytest

from harness.swarm import fixed_batches, fixed_loss, train_together
from peer_agent.aggregation import PARAMETERS_RUNNERS, RUNNERS

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


@pytest.mark.parametrize("aggregation", ["mean", "centered_clip"])
def test_an_attacker_derails_the_mean_but_not_centered_clip(make_trainer, aggregation):
    # Each peer gathers about 40 samples an epoch: enough that honest gradients agree in direction.
    # A longer round than make_trainer's: a sender that misses a chunk for next_chunk_timeout (a
    # quarter of it) is dropped, and a part left with two slices has no majority to clip with.
    options = dict(averaging=dict(aggregation=aggregation, averaging_timeout=30.0),
                   training=dict(target_batch_size=128))
    first = make_trainer(seed=1, **options)
    second = make_trainer(seed=2, joins=first, **options)
    attacker = make_trainer(seed=3, joins=first, **options)
    assert first.optimizer.grad_averager._runner_class is RUNNERS[aggregation]
    assert first.optimizer.state_averager._runner_class is PARAMETERS_RUNNERS.get(aggregation, RUNNERS[aggregation])
    poison(attacker)
    fixed = fixed_batches(first)
    before = fixed_loss(first, fixed)

    train_together([first, second, attacker], epochs=EPOCHS)

    # How much the honest peers' loss on the same batches fell: the worse of the two.
    drop = before - max(fixed_loss(trainer, fixed) for trainer in (first, second))
    if aggregation == "mean":
        assert drop < 0.05, f"the attack works on the mean: honest loss changed by {-drop:+.3f}"
    else:
        assert drop > 0.1, f"with CenteredClip the honest loss falls: it changed by {-drop:+.3f}"


