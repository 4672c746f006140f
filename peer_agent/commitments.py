"""The commitments a peer signs for the portal's spot checks (peer_agent/spotcheck.py says what they are for)."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from peer_agent.protocol import MAX_COMMITTED_STEPS, EpochCommitment, RunConfig, StepCommitment
from peer_agent.spotcheck import commitment_sign

if TYPE_CHECKING:
    from hivemind.utils.crypto import RSAPrivateKey

logger = logging.getLogger(__name__)


class Commitments:
    """What this peer claims it computed: the micro-batches of each step it commits to, kept by epoch,
    and each epoch's commitment, signed with the peer's key once the peer has left that epoch.

    It commits to what it is told (peer_agent/training.py gives it what the step computer says a step
    computed) and checks none of it: the claim is this part's, the work the step computer's.
    ``local_epoch`` reads the peer's epoch now.
    """

    def __init__(self, config: RunConfig, *, run_id: str, session_id: int, key: RSAPrivateKey,
                 local_epoch: Callable[[], int]):
        self.config, self.run_id, self.session_id, self.key = config, run_id, session_id, key
        self.local_epoch = local_epoch
        self.open_epochs: dict[int, list[StepCommitment]] = {}  # epoch -> its steps committed so far
        self.signed: deque[EpochCommitment] = deque()  # closed epochs' commitments, until taken

    def step_commit(self, epoch: int, cursor: int, fingerprints: list[str], parameters: str) -> None:
        """Keep a step's micro-batches (from ``cursor`` on, one fingerprint each, the step's ``parameters``
        with the first) for its epoch's commitment; sign the commitments of the epochs now behind."""
        micro_batch_size = self.config.training.per_device_batch_size
        steps = self.open_epochs.setdefault(epoch, [])
        for offset, fingerprint in enumerate(fingerprints):
            if len(steps) < MAX_COMMITTED_STEPS:
                steps.append(StepCommitment(cursor=cursor + offset, samples=micro_batch_size,
                                            fingerprint=fingerprint, parameters=None if offset else parameters))
            elif len(steps) == MAX_COMMITTED_STEPS:
                logger.warning("More than %d micro-batches in epoch %d: the rest cannot be committed to, so the portal "
                               "cannot confirm them; a larger --per-device-batch-size helps", MAX_COMMITTED_STEPS, epoch)
                break
        now = self.local_epoch()
        for closed in sorted(e for e in self.open_epochs if e < now):
            commitment = EpochCommitment(epoch=closed, micro_batch_size=micro_batch_size,
                                         shuffle_buffer=self.config.data.shuffle_buffer,
                                         steps=self.open_epochs.pop(closed), signature="A")
            self.signed.append(self.sign(commitment))

    def sign(self, commitment: EpochCommitment) -> EpochCommitment:
        """``commitment`` signed with this peer's key, for this run and session."""
        return commitment_sign(commitment, run_id=self.run_id, session_id=self.session_id, key=self.key)

    def take(self) -> list[EpochCommitment]:
        """The signed commitments of the epochs this peer closed since the last call, oldest first."""
        taken = list(self.signed)
        self.signed.clear()
        return taken
