"""No claim stays pending for ever: what the monitor never judged is rejected PENDING_MAX_AGE after
it was reported, unless its epoch is the one the swarm is still gathering."""

import datetime

from runs.credit.rollup import credit_rollup
from runs.credit.verification import NEVER_CONFIRMED, PENDING_MAX_AGE, pending_expire
from runs.models import RunCredit, RunSample, SessionEpoch
from tests.factories import NOW, RunFactory, UserFactory, report, session_for

OLD = NOW - PENDING_MAX_AGE - datetime.timedelta(minutes=1)


def status(session, epoch: int) -> str | None:
    return SessionEpoch.objects.filter(session=session, epoch=epoch).values_list("status", flat=True).first()


def test_claims_nobody_confirmed_in_time_are_rejected_and_leave_pending_credit(db, clock):
    run, vik = RunFactory(), UserFactory(username="vik")
    session = session_for(run, vik)
    RunSample.objects.create(run=run, at=NOW - datetime.timedelta(minutes=5), global_epoch=10, samples_per_second=30,
                             alive_peers=2)
    report(session, 64, epoch=3, at=OLD, confirmed=False)  # closed while the coordinator was down
    report(session, 64, epoch=10**6, at=OLD, confirmed=False)  # an epoch the swarm never reaches
    report(session, 64, epoch=10, at=OLD, confirmed=False)  # the swarm's current epoch: it waits
    report(session, 64, epoch=4, at=OLD)  # confirmed: stays so
    report(session, 64, epoch=5, at=NOW - datetime.timedelta(hours=1), confirmed=False)  # still within its time
    credit_rollup()
    assert RunCredit.objects.get(run=run, user=vik).samples - RunCredit.objects.get(run=run, user=vik).samples_verified == 256

    assert pending_expire(now=NOW) == 2
    assert (status(session, 3), status(session, 10**6)) == ("rejected", "rejected")
    assert SessionEpoch.objects.get(session=session, epoch=3).detail == NEVER_CONFIRMED
    assert (status(session, 10), status(session, 4), status(session, 5)) == (None, "verified", None)
    assert pending_expire(now=NOW) == 0, "each claim is judged once"

    clock.now = NOW + datetime.timedelta(minutes=1)
    credit_rollup()
    total = RunCredit.objects.get(run=run, user=vik)
    assert (total.samples_verified, total.samples_rejected) == (64, 128)

    RunSample.objects.create(run=run, at=NOW, global_epoch=11, samples_per_second=30, alive_peers=2)
    assert pending_expire(now=NOW) == 1, "once the swarm moved past it, the waiting epoch is rejected too"
    assert status(session, 10) == "rejected"
