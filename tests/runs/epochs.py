"""Sessions, their reports and the verdict on their epochs, as the tests of verified credit
(tests/runs/credit/test_verification.py, test_flags_view.py, test_monitor.py) make them: reports are
stored unconfirmed, at the current time, and only `judge` (the monitor's verification of a closed
epoch) decides them. Unless told ``checked=False``, `report` also stands for a commitment of the
epoch whose spot check passed, so that the rules these tests exercise are the others
(tests/runs/swarm/test_spot_checks.py tests the checks)."""

import datetime
import itertools

from django.utils import timezone

from accounts.services import token_create
from runs.credit import verification
from runs.models import ContributionEvent, StepCommitment, TrainingSession
from tests.factories import UserFactory

_seq = itertools.count(1)


def session_for(run, username="amina", user=None):
    user = user or UserFactory(username=username)
    token, _ = token_create(user=user, name="laptop")
    return TrainingSession.objects.create(run=run, user=user, token=token, peer_public_key=f"ssh-rsa {user.username}AAAA",
                                          agent_version="0.1.0", access_expires_at=timezone.now())


def report(session, samples, epoch, checked=True):
    ContributionEvent.objects.create(session=session, seq=next(_seq), samples=samples, steps=1, local_epoch=epoch,
                                     loss=5.0, samples_per_second=10.0, sent_at=timezone.now())
    if checked:
        commitment, _ = StepCommitment.objects.get_or_create(
            session=session, epoch=epoch, defaults=dict(micro_batch_size=8, shuffle_buffer=1000, steps=[], samples=0,
                                                        outcome=StepCommitment.Outcome.PASSED))
        commitment.samples += samples
        commitment.save(update_fields=["samples"])


def judge(run, epoch, closed_minutes_ago=1.0):
    closed_at = timezone.now() - datetime.timedelta(minutes=closed_minutes_ago)
    return verification.epoch_judge(run=run, epoch=epoch, closed_at=closed_at)
