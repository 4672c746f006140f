"""amina's machines, the volunteer's page's example (tests/accounts/test_volunteer_machines.py and the
phone's view of it, tests/browser/test_accounts_pages.py): a laptop killed and restarted, and a cloud machine
suspended, whose epochs cover every way an epoch can lose samples."""

import datetime

from django.utils import timezone

from runs.credit import verification
from runs.models import NO_STATE_HELD, SessionEpoch, StepCommitment, TrainingSession
from tests.factories import RunFactory, UserFactory, report

_Status = SessionEpoch.Status


def commit(session, epoch: int, outcome: str, detail: str = "") -> None:
    StepCommitment.objects.create(session=session, epoch=epoch, micro_batch_size=8, shuffle_buffer=100, steps=[],
                                  samples=64, outcome=outcome, check_detail=detail)


def judged(session, epoch: int, samples: int, status: str, **fields) -> None:
    report(session, samples, epoch=epoch, confirmed=False, at=timezone.now())
    SessionEpoch.objects.create(session=session, epoch=epoch, reported_samples=samples, status=status,
                                checked_at=timezone.now(), **fields)


def amina_machines_make():
    """amina's laptop: a session killed (ended) and the session it restarted as, live; and a cloud machine whose
    session was suspended. Their epochs cover every way an epoch can lose samples."""
    from accounts.services import token_create

    amina, run = UserFactory(username="amina"), RunFactory(name="sahajBERT")
    laptop, _ = token_create(user=amina, name="laptop")
    cloud, _ = token_create(user=amina, name="cloud")

    def session(token, **fields) -> TrainingSession:
        return TrainingSession.objects.create(run=run, user=amina, token=token, peer_public_key="ssh-rsa AAAA",
                                              agent_version="0.13.0", access_expires_at=timezone.now(), **fields)

    an_hour_ago = timezone.now() - datetime.timedelta(hours=1)
    killed = session(laptop, started_at=an_hour_ago, last_seen_at=an_hour_ago, ended_at=an_hour_ago)
    judged(killed, 1, 64, _Status.VERIFIED, announced_samples=64)
    judged(killed, 2, 64, _Status.REJECTED, detail=verification.NO_COMMITMENT)
    restarted = session(laptop)
    judged(restarted, 3, 64, _Status.VERIFIED, announced_samples=48)  # 48 confirmed, 16 lost
    judged(restarted, 4, 64, _Status.REJECTED)
    commit(restarted, 4, StepCommitment.Outcome.DIVERGED, "epoch 4: 2 of 8 micro-batches were computed elsewhere")
    judged(restarted, 5, 64, _Status.REJECTED)
    commit(restarted, 5, StepCommitment.Outcome.UNCHECKED, NO_STATE_HELD.format(epoch=5))
    report(restarted, 32, epoch=6, confirmed=False, at=timezone.now())  # not judged yet: pending
    suspended = session(cloud, suspended_at=timezone.now(), suspension_reason="2 failed spot checks")
    judged(suspended, 4, 64, _Status.FLAGGED, detail="epoch 4: session suspended by spot checks")
    return amina, run
