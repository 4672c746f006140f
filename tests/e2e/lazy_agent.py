"""A lazy peer agent, for tests only: it trains one step in ten and passes off the other nine, which
it announces to the swarm, reports to the portal and commits to with the fingerprint of its last real
step. Run as ``python -m tests.e2e.lazy_agent join ...``. The samples it really computed are written to
``$PEER_AGENT_HOME/computed`` after each real step, for a test or bench/liar.py to weigh its credit against.

It is the real agent with one part of its ``Trainer`` swapped: the step computer (:class:`LazySteps`). The
rest (the commitments it signs, the metrics it publishes, its reports) is the honest agent's, handed the
lazy steps as if they had been computed."""

import os
import sys
from functools import partial
from pathlib import Path

import torch

import peer_agent.training
from peer_agent import cli
from peer_agent.steps import ComputedStep, StepComputer

TRAINS_ONE_STEP_IN = 10


class LazySteps(StepComputer):
    """The agent's step computer, computing one step in ten (:meth:`real`) and passing the others off
    (:meth:`passed_off`)."""

    def __init__(self, **parts) -> None:
        super().__init__(**parts)
        self.lazy_steps = 0
        self.last_real: tuple[str, float] | None = None  # a fingerprint and the loss of its last real step
        self.computed = 0  # samples really computed

    def compute(self) -> ComputedStep:
        self.lazy_steps += 1
        if self.last_real is None or self.lazy_steps % TRAINS_ONE_STEP_IN == 0:
            return self.real()
        epoch = self.optimizer.local_epoch
        # The truth: it says it stayed with the swarm.
        return self.passed_off(epoch, self.sketcher.parameters(self.model, epoch))

    def real(self) -> ComputedStep:
        """A step trained for real (its samples counted as computed)."""
        step = super().compute()
        if step.accepted:  # the trainer commits to it: its last fingerprint is the one passed off from now on
            self.last_real = (step.fingerprints[-1], self.last_real[1] if self.last_real else 0.0)
        if self.last_real is not None:  # a skipped step commits nothing
            self.last_real = (self.last_real[0], step.loss)
        training = self.training
        self.computed += training.per_device_batch_size * training.gradient_accumulation_steps
        (Path(os.environ["PEER_AGENT_HOME"]) / "computed").write_text(str(self.computed))
        return step

    def passed_off(self, epoch: int, parameters: str) -> ComputedStep:
        """A step announced to the swarm, reported and committed to (at ``parameters``, with the last real
        step's fingerprint) whose micro-batches were drawn and never trained on."""
        accumulation = self.training.gradient_accumulation_steps
        cursor = self.cursor
        for _ in range(accumulation):
            next(self.batches)
            self.cursor += 1
        for param in self.model.parameters():
            param.grad = torch.zeros_like(param)
        self.optimizer.step()  # the swarm counts its samples
        self.optimizer.zero_grad()
        fingerprint, loss = self.last_real
        return ComputedStep(epoch=epoch, cursor=cursor, parameters=parameters, fingerprints=[fingerprint] * accumulation,
                            loss=loss, contributed=True, accepted=True)


if __name__ == "__main__":
    peer_agent.training.Trainer = partial(peer_agent.training.Trainer, step_computer_factory=LazySteps)
    sys.exit(cli.main())
