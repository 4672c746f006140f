"""An aggregator: a peer that joins a run's averaging rounds without computing (DeDLOC's auxiliary peers).

A server with a good link but no accelerator helps volunteers on thin links most by reducing part of
their all-reduce: in hivemind's auxiliary mode (``auxiliary=True``, ``AveragingMode.AUX``) it joins
each gradient round with the peer's declared bandwidth, sends no vector of its own and returns the
average of the part the partition gives it (``peer_agent.averaging``: the bandwidth LP, with the floor
applied to aggregators as to every peer that accepts connections).

It does not use hivemind's ``Optimizer.step(auxiliary)`` loop: that starts an auxiliary's all-reduce
when its own progress tracker says the epoch is over, which it learns from the trainers' records a
refresh later than they do; its members then wait for its part until they give up on it. Here the
aggregator triggers its round as soon as the group is formed. It joins the parameter averaging that
follows each gradient round too (every ``average_state_every`` epochs, as the trainers' hivemind does),
reducing its share of the parameters and optimizer statistics the same way.
Its membership proof is checked like anyone's; its access token names the role ("#aggregator").
It reports no samples to the portal, and earns no credit.
"""

from __future__ import annotations

import logging
import threading
import zlib

from hivemind.averaging.control import AveragingStage, StepControl
from hivemind.utils.timed_storage import get_dht_time

from peer_agent.model import model_build
from peer_agent.training import SwarmPeer, TrainerSetup, dht_start, optimizer_build

logger = logging.getLogger(__name__)


class Aggregator(SwarmPeer):
    """One auxiliary peer of a run; call :meth:`step` every 0.1 s or so (it returns at once): it joins the
    gradient round that closes each of the swarm's epochs and the parameter averaging that opens the next."""

    def __init__(self, setup: TrainerSetup, *, vocab_size: int, pad_token_id: int = 0):
        if setup.client_mode:
            raise ValueError("an aggregator must accept connections from the run's peers: it cannot run in client mode")
        self.setup = setup
        # Only the parameters' shapes matter: an aggregator reduces other peers' slices of them.
        model = model_build(setup.config, vocab_size, pad_token_id=pad_token_id, init_seed=zlib.crc32(setup.run_id.encode()))
        self.dht = dht_start(setup)
        try:
            self.optimizer = optimizer_build(setup, self.dht, model, auxiliary=True)
        except BaseException:
            self.dht.shutdown()
            raise
        self._shut_down, self._withdrawing = False, threading.Lock()
        self._round: StepControl | None = None  # the gradient round being arranged or run
        self._round_epoch = -1  # the swarm's epoch whose closing round it last joined
        self._state_round: StepControl | None = None  # the parameter averaging that follows it
        self.state_groups: list[int] = []  # the size of each parameter averaging it took part in (0: failed)

    def step(self) -> int | None:
        """Take the aggregator's part in the swarm's rounds; returns at once. Starts matchmaking for the
        gradient round that closes the swarm's epoch when it nears, and the all-reduce as soon as the group
        is formed: an aggregator has nothing to compute first, and its members would wait for it; then the
        parameter averaging that follows (:attr:`state_groups`). Returns the size of the group of a
        gradient round that just ended (0 if it failed), else None."""
        optimizer, tracker = self.optimizer, self.optimizer.tracker
        if tracker.global_epoch > tracker.local_progress.epoch:
            with tracker.pause_updates():  # the record it publishes follows the swarm's epoch, with 0 samples
                tracker.update_epoch(tracker.global_epoch)
        state = self._state_round
        if state is not None and state.done():
            self._state_round = None
            self.state_groups.append(_group_size(state))
        control = self._round
        if control is not None:
            if control.done():
                self._round = None
                optimizer.grad_averager.notify_used_averaged_gradients()  # it has none to use: nothing is waiting
                if (self._round_epoch + 1) % optimizer.average_state_every == 0 and self._state_round is None:
                    self._state_round = self._state_round_start(self._round_epoch + 1)
                return _group_size(control)
            if not control.triggered and control.stage == AveragingStage.AWAITING_TRIGGER:
                optimizer.grad_averager.step(control=control, wait=False)
            return None
        due = tracker.estimated_next_update_time - get_dht_time() <= optimizer.matchmaking_time
        if tracker.global_epoch > self._round_epoch and due:
            self._round_epoch = tracker.global_epoch
            self._round = optimizer.grad_averager.schedule_step(timeout=optimizer.averaging_timeout)
        return None

    def _state_round_start(self, epoch: int) -> StepControl:
        """Join the parameter averaging that opens ``epoch``. The trainers look for its group after their
        optimizer step, or from before the gradient round ends (hivemind's Optimizer._maybe_schedule_state_
        averaging); looking from now for a matchmaking time, the aggregator joins either group rather than
        leading one of its own. ``gather`` is the epoch each member declares and the others catch up to
        (TrainingStateAverager's ``sync_epoch_when_averaging``): the epoch the trainers are entering, never
        more. Nothing to compute first, so its all-reduce may start as soon as the group is formed."""
        optimizer = self.optimizer
        control = optimizer.state_averager.schedule_step(scheduled_time=get_dht_time() + optimizer.matchmaking_time,
                                                         gather=epoch, timeout=optimizer.averaging_timeout)
        control.allow_allreduce()
        return control

    @property
    def local_epoch(self) -> int:
        """The swarm's epoch as this aggregator last read it."""
        return self.optimizer.tracker.global_epoch


def _group_size(control: StepControl) -> int:
    """The size of the group of a finished round; 0 if it failed or was cancelled."""
    return 0 if control.cancelled() or control.exception() is not None else len(control.result())
