"""A lazy peer agent, for tests only: it trains one step in ten and passes off the other nine, which
it announces to the swarm, reports to the portal and commits to with the fingerprint of its last real
step. Run as ``python -m tests.e2e.lazy_agent join ...``. The samples it really computed are written to
``$PEER_AGENT_HOME/computed`` after each real step, for a test or bench/liar.py to weigh its credit against."""

import os
import sys
from pathlib import Path

import torch

import peer_agent.training
from peer_agent import cli
from peer_agent.training import StepResult, Trainer

TRAINS_ONE_STEP_IN = 10


class LazyTrainer(Trainer):
    _lazy_steps = 0
    _last_real: tuple[str, float] | None = None  # a fingerprint and the loss of its last real step

    _computed = 0

    def step(self) -> StepResult:
        self._lazy_steps += 1
        if self._last_real is None or self._lazy_steps % TRAINS_ONE_STEP_IN == 0:
            return self._step_real()
        epoch = self.optimizer.local_epoch
        # The truth: it says it stayed with the swarm.
        return self._step_passed_off(epoch, self._sketcher.parameters(self.model, epoch))

    def _step_real(self) -> StepResult:
        """A step trained for real (its samples counted as computed)."""
        result = Trainer.step(self)
        if self._last_real is not None:  # a skipped step commits nothing
            self._last_real = (self._last_real[0], result.loss)
        training = self.setup.config.training
        self._computed += training.per_device_batch_size * training.gradient_accumulation_steps
        (Path(os.environ["PEER_AGENT_HOME"]) / "computed").write_text(str(self._computed))
        return result

    def _step_passed_off(self, epoch: int, parameters: str) -> StepResult:
        """A step announced to the swarm, reported and committed to (at ``parameters``, with the last real
        step's fingerprint) whose micro-batches were drawn and never trained on."""
        training = self.setup.config.training
        cursor = self._cursor
        for _ in range(training.gradient_accumulation_steps):
            next(self._batches)
            self._cursor += 1
        for param in self.model.parameters():
            param.grad = torch.zeros_like(param)
        self.optimizer.step()  # the swarm counts its samples
        self.optimizer.zero_grad()
        fingerprint, loss = self._last_real
        super()._step_commit(epoch, cursor, [fingerprint] * training.gradient_accumulation_steps, parameters)
        samples = training.per_device_batch_size * training.gradient_accumulation_steps
        self._after_good_step(loss, samples)
        return StepResult(samples=samples, loss=loss, local_epoch=self.optimizer.local_epoch,
                          global_epoch=self.optimizer.tracker.global_epoch, samples_per_second=samples / 0.05)

    def _step_commit(self, epoch: int, cursor: int, fingerprints: list[str], parameters: str) -> None:
        self._last_real = (fingerprints[-1], self._last_real[1] if self._last_real else 0.0)
        super()._step_commit(epoch, cursor, fingerprints, parameters)


if __name__ == "__main__":
    peer_agent.training.Trainer = LazyTrainer
    sys.exit(cli.main())
