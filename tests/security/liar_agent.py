"""A lying peer agent, for tests only: the real agent with two parts of its ``Trainer`` swapped, the step
computer (:class:`LiarSteps`) and the commitments (:class:`LiarCommitments`), as the volunteer of issue 29
ran it. Run as ``python -m tests.security.liar_agent join ...``.

It takes turns, by the epoch a step begins in (``LIAR_STRATEGIES``, comma-separated, from the environment):

- ``probe``: honest steps. They pass their checks and were meant to vouch for the rest.
- ``shield``: one real step, then steps passed off with the last real fingerprint and the sketch of
  parameters 5% off the swarm's, so that a drawn fake reads as "computed elsewhere" (the step computer lies).
- ``dark``: nothing computed; the steps are passed off at the swarm's parameters (the step computer lies),
  and their commitment is held back until the validator has let go of the epoch (``DARK_DELAY_EPOCHS``
  later; the commitments lie).
- ``stall``: honest steps, and the epoch's commitment is sent again re-signed with a cursor of 2**40,
  which would keep the validator replaying the stream (the real one stays, so only the stall is judged;
  the commitments lie).

All along (``capture``, unless ``LIAR_CAPTURE=off``), its state averager declares a state-sharing priority
half an epoch ahead of its own, so that hivemind's download asks it first, and serves its parameters 5% off
the swarm's: held by the validator as the swarm's state, it would make every honest step look computed
elsewhere (hivemind's state averager swapped).

Every step announces and reports what an honest one would, at the pace of its real steps: faked steps
cost nothing, and a liar passing them off as fast as it can makes the swarm's epochs shorter than an
averaging round, every peer steps alone and no epoch is verified, its own included (seen in this test: the
swarm raced a hundred epochs a minute; docs/trust.md, "Not defended yet"). A liar who wants credit keeps
the swarm going. The samples it really computed are written
to ``$PEER_AGENT_HOME/computed`` after each real step (tests/e2e/lazy_agent.py), for the test to weigh its
credit against.
"""

import os
import sys
import time
from functools import partial
from pathlib import Path

import torch
from hivemind.averaging.averager import DecentralizedAverager

import peer_agent.training
from peer_agent import averaging, cli
from peer_agent.commitments import Commitments
from peer_agent.protocol import EpochCommitment
from peer_agent.steps import ComputedStep
from tests.e2e.lazy_agent import LazySteps

# Past the ingest's deadline (runs.ingest.reports.COMMITMENT_WINDOW_EPOCHS, 6; the test checks) and the
# validator's held states. The agent process loads no Django, so the figure is written out here.
DARK_DELAY_EPOCHS = 10
STRATEGIES = os.environ.get("LIAR_STRATEGIES", "probe,shield,dark,stall").split(",")
CAPTURE = os.environ.get("LIAR_CAPTURE", "on") == "on"


def strategy_of(epoch: int) -> str:
    return STRATEGIES[epoch % len(STRATEGIES)]


class LiarSteps(LazySteps):
    """Its own turns of real and faked steps (``compute``); the faked step is the lazy agent's."""

    def __init__(self, **parts) -> None:
        super().__init__(**parts)
        # For the test: the name the validator knows this peer by when it downloads its state.
        (Path(os.environ["PEER_AGENT_HOME"]) / "peer_id").write_text(str(self.optimizer.state_averager.peer_id))
        self._real_in_epoch: dict[int, int] = {}
        self._real_step_s = 0.0

    def compute(self) -> ComputedStep:
        epoch = self.optimizer.local_epoch
        strategy = strategy_of(epoch)
        real_steps = self._real_in_epoch.setdefault(epoch, 0)
        if self.last_real is None or strategy in ("probe", "stall") or (strategy == "shield" and not real_steps):
            self._real_in_epoch[epoch] = real_steps + 1
            began = time.monotonic()
            step = self.real()
            self._real_step_s = time.monotonic() - began
            return step
        time.sleep(self._real_step_s)
        return self._faked(epoch, off_state=strategy == "shield")

    def _faked(self, epoch: int, *, off_state: bool) -> ComputedStep:
        with torch.no_grad():
            if off_state:
                for param in self.model.parameters():
                    param.mul_(1.05)
            parameters = self.sketcher.parameters(self.model, epoch)
            if off_state:
                for param in self.model.parameters():
                    param.div_(1.05)
        return self.passed_off(epoch, parameters)


class LiarCommitments(Commitments):
    """The agent's commitments part, holding back the dark epochs' and sending a stalling second one of each
    stall epoch (``take``)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._held_back: list[EpochCommitment] = []

    def take(self) -> list[EpochCommitment]:
        sent = []
        for commitment in super().take():
            strategy = strategy_of(commitment.epoch)
            if strategy == "dark":
                self._held_back.append(commitment)
                continue
            if strategy == "stall":  # a second commitment of the epoch, re-signed: the ingest judges it alone
                stalled = commitment.model_copy(update={"steps": [
                    *commitment.steps[:-1], commitment.steps[-1].model_copy(update={"cursor": 2**40})]})
                sent.append(self.sign(stalled))
            sent.append(commitment)
        due = [c for c in self._held_back if c.epoch + DARK_DELAY_EPOCHS <= self.local_epoch()]
        self._held_back = [c for c in self._held_back if c not in due]
        return sent + due


class CapturingStateAverager(averaging.MembersOnlyStateAverager):
    """The agent's state averager, serving its parameters 5% off under a priority half an epoch ahead."""

    state_sharing_priority = property(
        DecentralizedAverager.state_sharing_priority.fget,
        lambda self, epoch: DecentralizedAverager.state_sharing_priority.fset(self, epoch + 0.5))

    def get_current_state(self):
        metadata, tensors, infos = super().get_current_state()
        parameters = len(self.main_parameters)
        return metadata, [tensor * 1.05 if index < parameters else tensor for index, tensor in enumerate(tensors)], infos


if __name__ == "__main__":
    peer_agent.training.Trainer = partial(peer_agent.training.Trainer, step_computer_factory=LiarSteps,
                                          commitments_factory=LiarCommitments)
    if CAPTURE:
        averaging.MembersOnlyStateAverager = CapturingStateAverager
    sys.exit(cli.main())
