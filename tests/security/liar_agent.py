"""A lying peer agent, for tests only: the real agent with ``Trainer.step`` and ``Trainer.commitments_take``
replaced, as the volunteer of issue 29 ran it. Run as ``python -m tests.security.liar_agent join ...``.

It takes turns, by the epoch a step begins in (``LIAR_STRATEGIES``, comma-separated, from the environment):

- ``probe``: honest steps. They pass their checks and were meant to vouch for the rest.
- ``shield``: one real step, then steps passed off with the last real fingerprint and the sketch of
  parameters 5% off the swarm's, so that a drawn fake reads as "computed elsewhere".
- ``dark``: nothing computed; the steps are passed off at the swarm's parameters, and their commitment
  is held back until the validator has let go of the epoch (``DARK_DELAY_EPOCHS`` later).
- ``stall``: honest steps, and the epoch's commitment is sent again re-signed with a cursor of 2**40,
  which would keep the validator replaying the stream (the real one stays, so only the stall is judged).

All along (``capture``, unless ``LIAR_CAPTURE=off``), its state averager declares a state-sharing priority
half an epoch ahead of its own, so that hivemind's download asks it first, and serves its parameters 5% off
the swarm's: held by the validator as the swarm's state, it would make every honest step look computed
elsewhere.

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
from pathlib import Path

import torch
from hivemind.averaging.averager import DecentralizedAverager

import peer_agent.training
from peer_agent import averaging, cli
from peer_agent.protocol import EpochCommitment
from peer_agent.spotcheck import commitment_sign
from peer_agent.training import StepResult
from tests.e2e.lazy_agent import LazyTrainer

# Past the ingest's deadline (runs.ingest.reports.COMMITMENT_WINDOW_EPOCHS, 6; the test checks) and the
# validator's held states. The agent process loads no Django, so the figure is written out here.
DARK_DELAY_EPOCHS = 10
STRATEGIES = os.environ.get("LIAR_STRATEGIES", "probe,shield,dark,stall").split(",")
CAPTURE = os.environ.get("LIAR_CAPTURE", "on") == "on"


def strategy_of(epoch: int) -> str:
    return STRATEGIES[epoch % len(STRATEGIES)]


class LiarTrainer(LazyTrainer):
    """Its own turns of real and faked steps (``step``); the faked step is the lazy agent's."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # For the test: the name the validator knows this peer by when it downloads its state.
        (Path(os.environ["PEER_AGENT_HOME"]) / "peer_id").write_text(str(self.optimizer.state_averager.peer_id))
        self._real_in_epoch: dict[int, int] = {}
        self._held_back: list[EpochCommitment] = []
        self._real_step_s = 0.0

    def step(self) -> StepResult:
        epoch = self.optimizer.local_epoch
        strategy = strategy_of(epoch)
        real_steps = self._real_in_epoch.setdefault(epoch, 0)
        if self._last_real is None or strategy in ("probe", "stall") or (strategy == "shield" and not real_steps):
            self._real_in_epoch[epoch] = real_steps + 1
            began = time.monotonic()
            result = self._step_real()
            self._real_step_s = time.monotonic() - began
            return result
        time.sleep(self._real_step_s)
        return self._step_faked(epoch, off_state=strategy == "shield")

    def _step_faked(self, epoch: int, *, off_state: bool) -> StepResult:
        with torch.no_grad():
            if off_state:
                for param in self.model.parameters():
                    param.mul_(1.05)
            parameters = self._sketcher.parameters(self.model, epoch)
            if off_state:
                for param in self.model.parameters():
                    param.div_(1.05)
        return self._step_passed_off(epoch, parameters)

    def commitments_take(self) -> list[EpochCommitment]:
        sent = []
        for commitment in super().commitments_take():
            strategy = strategy_of(commitment.epoch)
            if strategy == "dark":
                self._held_back.append(commitment)
                continue
            if strategy == "stall":  # a second commitment of the epoch, re-signed: the ingest judges it alone
                stalled = commitment.model_copy(update={"steps": [
                    *commitment.steps[:-1], commitment.steps[-1].model_copy(update={"cursor": 2**40})]})
                sent.append(commitment_sign(stalled, run_id=self.setup.run_id, session_id=self.setup.session_id,
                                            key=self.setup.private_key))
            sent.append(commitment)
        due = [c for c in self._held_back if c.epoch + DARK_DELAY_EPOCHS <= self.optimizer.local_epoch]
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
    peer_agent.training.Trainer = LiarTrainer
    if CAPTURE:
        averaging.MembersOnlyStateAverager = CapturingStateAverager
    sys.exit(cli.main())
