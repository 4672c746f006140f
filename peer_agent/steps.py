"""Local steps: a peer's share of the work, computed on micro-batches of its session's stream."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from hivemind.optim.optimizer import Optimizer

from peer_agent.optim import flat_params
from peer_agent.precision import Precision
from peer_agent.protocol import FINGERPRINT_WIDTH, TrainingConfig
from peer_agent.spotcheck import Sketcher, fingerprint_encode


@dataclass(frozen=True)
class ComputedStep:
    """What a local step computed: what the trainer reports, and commits to when the swarm counted it."""

    epoch: int  # the local epoch the step began in
    cursor: int  # the place of its first micro-batch in the session's stream
    parameters: str  # the sketch of the parameters its gradients were computed at
    fingerprints: list[str]  # each micro-batch's gradient sketch; empty when the loss was not finite
    loss: float  # the mean of its micro-batches' losses
    contributed: bool  # its gradients were finite and went into the collaboration
    accepted: bool  # hivemind counted its samples (it dropped none for being out of sync)


class StepComputer:
    """Runs local steps: ``gradient_accumulation_steps`` micro-batches forward and backward in the peer's
    precision, a fingerprint of each micro-batch's gradient, clipping, and ``hivemind.Optimizer.step``
    (which averages and applies a global step when it is time)."""

    def __init__(self, *, model: torch.nn.Module, optimizer: Optimizer, precision: Precision,
                 batches: Iterator[dict[str, torch.Tensor]], training: TrainingConfig, run_id: str):
        self.model, self.optimizer, self.precision = model, optimizer, precision
        self.batches, self.training = batches, training
        self.sketcher = Sketcher(run_id)
        self.cursor = 0  # micro-batches drawn from the session's stream so far
        self._returned: list[dict[str, torch.Tensor]] = []  # micro-batches of a dropped step, drawn again first

    def compute(self) -> ComputedStep:
        """One local step."""
        training = self.training
        self.model.train()
        epoch, cursor = self.optimizer.local_epoch, self.cursor
        # What the step's gradients are computed at: a validator holding other parameters (this peer's
        # averaging round failed, and it stepped alone) cannot check them (runs/swarm/spotcheck.py).
        parameters = self.sketcher.parameters(self.model, epoch)
        # Kept for the validator to ask for by this sketch, should it miss the moment the state was served.
        self.optimizer.state_averager.epoch_states.keep(epoch, parameters, flat_params(self.optimizer.param_groups))
        loss_sum = torch.zeros((), device=self.precision.device)
        # The sketch is linear: each micro-batch's gradient is sketched as the difference the micro-batch
        # made to the accumulated gradients' sketch (peer_agent/spotcheck.py).
        sketches = [torch.zeros(FINGERPRINT_WIDTH)]
        drawn = []
        for _micro_batch in range(training.gradient_accumulation_steps):
            drawn.append(self._returned.pop(0) if self._returned else next(self.batches))
            batch = {key: value.to(self.precision.device, non_blocking=True) for key, value in drawn[-1].items()}
            self.cursor += 1
            with self.precision.autocast():
                loss = self.model(**batch).loss / training.gradient_accumulation_steps
            self.precision.backward(loss)
            loss_sum += loss.detach().float()
            sketches.append(self.sketcher.sketch(self.model, epoch))
        loss_value = loss_sum.item()

        loads = self.optimizer.state_loads
        contributed, fingerprints = math.isfinite(loss_value), []
        if contributed:
            # Each micro-batch's own loss, unscaled: what a validator recomputes (spotcheck.step_fingerprint).
            factor = training.gradient_accumulation_steps / self.precision.loss_scale
            fingerprints = [fingerprint_encode((after - before) * factor) for before, after in zip(sketches, sketches[1:])]
            self.precision.unscale(self.optimizer)
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), training.max_grad_norm)
            contributed = self.precision.step(self.optimizer, grad_norm)
        self.optimizer.zero_grad()
        # hivemind drops the gradients of a step it finds this peer out of sync at, and downloads the
        # swarm's state instead (hivemind.Optimizer.step): those samples go into no batch, and a peer
        # stuck behind the swarm would otherwise count them all toward its one epoch.
        accepted = contributed and self.optimizer.state_loads == loads
        if contributed and not accepted:
            # The next step draws the same micro-batches at the same places in the stream: the session's stream
            # runs no further ahead of its reported samples than its work (runs/ingest/reports.py,
            # commitment_beyond_reach). A restarted agent whose only partner was its killed self stepped out of
            # sync for a minute, until that peer's progress record lapsed, and drew 2.5× the micro-batches it
            # reported: its commitments then reached too far and its epochs earned nothing
            # (tests/e2e/test_preemption.py).
            self._returned[:0] = drawn
            self.cursor = cursor
        return ComputedStep(epoch=epoch, cursor=cursor, parameters=parameters, fingerprints=fingerprints,
                            loss=loss_value, contributed=contributed, accepted=accepted)
