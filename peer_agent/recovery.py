"""Getting back from bad steps: a copy of the last good parameters, and what to do after a step that was not finite."""

from __future__ import annotations

import logging

import torch
from hivemind.optim.optimizer import Optimizer

from peer_agent.optim import flat_params
from peer_agent.precision import Precision

logger = logging.getLogger(__name__)

BAD_STEPS_BEFORE_RELOAD = 3


class BadStepRecovery:
    """Keeps the parameters of the last good step on the CPU (every ``backup_every`` good steps and at
    every new epoch), and after a step whose loss or gradients were not finite puts them back, or, after
    ``BAD_STEPS_BEFORE_RELOAD`` such steps in a row with other peers about, downloads the swarm's state."""

    def __init__(self, optimizer: Optimizer, precision: Precision, *, backup_every: int):
        self.optimizer, self.precision, self.backup_every = optimizer, precision, backup_every
        self._backup: list[torch.Tensor] = []
        self._backup_epoch, self._steps_since_backup, self._bad_in_a_row = -1, 0, 0
        self.backup_take()

    def after_good_step(self) -> None:
        """A step went into the collaboration: back up now if it is time."""
        self._bad_in_a_row = 0
        self._steps_since_backup += 1
        if self.optimizer.local_epoch != self._backup_epoch or self._steps_since_backup >= self.backup_every:
            self.backup_take()

    def after_bad_step(self, loss: float) -> None:
        """A step's loss or gradients were not finite, and it went into nothing."""
        self._bad_in_a_row += 1
        logger.warning("Skipped a step: the loss (%s) or the gradients were not finite", loss)
        if self.precision.overflowed(loss):
            return
        if self._bad_in_a_row >= BAD_STEPS_BEFORE_RELOAD and self.optimizer.tracker.global_progress.num_peers > 1:
            logger.warning("%d bad steps in a row: downloading the collaboration's state again", self._bad_in_a_row)
            self.optimizer.load_state_from_peers()
            self._bad_in_a_row = 0
            return
        self.backup_restore()

    def backup_take(self) -> None:
        """Copy the parameters to the CPU, unless some are not finite."""
        with torch.no_grad():
            params = [param.detach() for param in flat_params(self.optimizer.param_groups)]
            if not all(torch.isfinite(param).all() for param in params):
                return
            self._backup = [param.to("cpu", copy=True) for param in params]
        self._backup_epoch, self._steps_since_backup = self.optimizer.local_epoch, 0

    @torch.no_grad()
    def backup_restore(self) -> None:
        """Put the last good parameters back, in the model and in the offloaded optimizer's copy
        (which hivemind would otherwise copy back over the model at the next global step)."""
        model_params, offloaded = flat_params(self.optimizer.param_groups), flat_params(self.optimizer.opt.param_groups)
        for model_param, optimizer_param, saved in zip(model_params, offloaded, self._backup, strict=True):
            model_param.copy_(saved)
            optimizer_param.copy_(saved)
        logger.warning("Restored the parameters saved at epoch %d", self._backup_epoch)
