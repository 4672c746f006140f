"""What milestone badges add to the credit rollup (runs/credit/milestones.py).

Generates ``--volunteers`` volunteers in one run (half of them in 100 teams), each with one session,
``--events`` reports and a verified epoch, in a scratch database, rolls them up once, then times the
rollup's recomputation of every (run, volunteer) pair (``run_credit_derive``, what a pass does for
each pair it touches) ``--repeats`` times with the badges kept (the portal) and with them switched
off (the baseline), and the first award of every badge on a table emptied first, without and with a
notification per badge. Prints p50 seconds and the ratio to the baseline.

ERASES the database's volunteers and runs first: point DATABASE_URL at a scratch database.

    DATABASE_URL=sqlite:////tmp/bench-milestones.sqlite3 .venv/bin/python -m bench.milestones --volunteers 2000
"""

import argparse
import datetime
import os
import statistics
import time


def _setup_django() -> None:
    if not os.environ.get("DATABASE_URL"):
        raise SystemExit("set DATABASE_URL to a scratch database (sqlite:////tmp/… or postgres://…): the benchmark erases it")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    os.environ.setdefault("CREDIT_ROLLUP_SETTLE_SECONDS", "0")
    import django

    django.setup()


def generate(*, volunteers: int, events: int) -> set[tuple[int, int]]:
    """The volunteers' work, rolled up once; returns the (run, user) pairs."""
    from django.conf import settings
    from django.core.management import call_command
    from django.utils import timezone

    from accounts.models import AgentToken, Team, User
    from runs.access.authority import authority_generate
    from runs.credit.rollup import credit_rollup
    from runs.models import ContributionEvent, Run, SessionEpoch, TrainingSession
    from runs.setup.forms import preset_config

    call_command("migrate", verbosity=0)
    for model in (ContributionEvent, SessionEpoch, TrainingSession, AgentToken, Run, User, Team):
        model.objects.all().delete()
    public_key, private_key = authority_generate(secret=settings.AUTHORITY_ENCRYPTION_KEY)
    run = Run.objects.create(name="Bench", slug="bench", status=Run.Status.ACTIVE, authority_public_key=public_key,
                             config=preset_config("tiny").model_dump(mode="json"), authority_private_key=private_key)
    teams = Team.objects.bulk_create([Team(name=f"Team {n}", slug=f"team-{n}") for n in range(100)])
    users = User.objects.bulk_create([
        User(username=f"v{n}", email=f"v{n}@example.org", pseudonym=f"p{n}", team=teams[n % 100] if n % 2 else None)
        for n in range(volunteers)])
    now = timezone.now()
    tokens = AgentToken.objects.bulk_create([AgentToken(user=user, name="bench", prefix="b", digest=f"{user.pk:064d}",
                                                        expires_at=now + datetime.timedelta(days=1)) for user in users])
    sessions = TrainingSession.objects.bulk_create([
        TrainingSession(run=run, user=token.user, token=token, peer_public_key="k", agent_version="0.1.0", access_expires_at=now)
        for token in tokens])
    # Samples spread so that volunteers sit below, at and past the thresholds.
    samples = [64 * (1 + n % 400) for n in range(volunteers)]
    ContributionEvent.objects.bulk_create([
        ContributionEvent(session=session, seq=seq, samples=samples[n] // events or 1, steps=1, local_epoch=1, loss=5.0,
                          samples_per_second=10.0, sent_at=now, received_at=now)
        for n, session in enumerate(sessions) for seq in range(1, events + 1)], batch_size=5000)
    SessionEpoch.objects.bulk_create([
        SessionEpoch(session=session, epoch=1, reported_samples=(samples[n] // events or 1) * events,
                     announced_samples=(samples[n] // events or 1) * events, status=SessionEpoch.Status.VERIFIED,
                     checked_at=now) for n, session in enumerate(sessions)], batch_size=5000)
    credit_rollup(batch_size=100_000)
    return {(run.pk, user.pk) for user in users}


def timed(function, repeats: int) -> float:
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--volunteers", type=int, default=2000)
    parser.add_argument("--events", type=int, default=3, help="reports per volunteer")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    _setup_django()
    from django.db import transaction
    from django.utils import timezone

    from runs.credit import milestones, rollup
    from runs.models import Milestone

    pairs = generate(volunteers=args.volunteers, events=args.events)
    print(f"{len(pairs):,} volunteers, {Milestone.objects.count():,} badges awarded by the first rollup", flush=True)

    def derive():
        with transaction.atomic():
            rollup.run_credit_derive(pairs=pairs, now=timezone.now())

    with_badges = timed(derive, args.repeats)
    real = rollup.milestones_refresh
    rollup.milestones_refresh = lambda **kwargs: []
    try:
        baseline = timed(derive, args.repeats)
    finally:
        rollup.milestones_refresh = real

    def first_award():
        with transaction.atomic():
            Milestone.objects.all().delete()
            milestones.milestones_refresh(holder="user", ids={user for _, user in pairs})

    award = timed(first_award, args.repeats)
    announce = milestones.milestones_announce
    milestones.milestones_announce = lambda badges: None
    try:
        award_quiet = timed(first_award, args.repeats)
    finally:
        milestones.milestones_announce = announce
    print(f"rollup pass over every volunteer, badges off (baseline): {baseline:.3f} s", flush=True)
    print(f"rollup pass over every volunteer, badges kept: {with_badges:.3f} s "
          f"(ratio {with_badges / baseline:.2f}x the baseline)", flush=True)
    print(f"first award of every volunteer's badges (delete + refresh), no notices: {award_quiet:.3f} s "
          f"({award_quiet / baseline:.2f}x the baseline pass)", flush=True)
    print(f"the same with a notice per badge (accounts.notifications.notify): {award:.3f} s "
          f"({award / baseline:.2f}x the baseline pass)", flush=True)


if __name__ == "__main__":
    main()
