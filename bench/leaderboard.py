"""Leaderboard queries on rolled-up aggregates against the old aggregation over events, on PostgreSQL.

Generates volunteers (1 in 20 hidden, 1 in 20 anonymous, half in 1,000 teams), one agent token and
one session each in one of three runs, and contribution events in SQL (``generate_series``): each
session reports every 30 s for a stretch that starts at a random moment of the last 7 days. Then it
runs the rollup (``runs.credit.rollup.credit_rollup``), timed, and times each board ``--repeats`` times:
p50/p95 in ms. The baselines, timed ``--baseline-repeats`` times in the same run: for boards by
volunteer, the query the portal ran before the rollup existed (group the run's events by volunteer
at request time); for boards by team, the query it ran before the rollup kept team totals (group
the volunteers' totals by team at request time); and, timed ``--repeats`` times, the same boards
summing the share column's denominator over the volunteers' totals per request, as they did before
the rollup kept run totals.

ERASES the database's volunteers, runs and events first: point DATABASE_URL at a scratch database.

    DATABASE_URL=postgres://postgres@127.0.0.1:55433/credit .venv/bin/python -m bench.leaderboard \
        --volunteers 100000 --events 10000000
"""

import argparse
import os
import statistics
import time

RUNS = 3


def _setup_django() -> None:
    if not os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")):
        raise SystemExit("set DATABASE_URL=postgres://… (a scratch database: the benchmark erases it)")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    os.environ.setdefault("CREDIT_ROLLUP_SETTLE_SECONDS", "0")
    import django

    django.setup()


def generate(*, volunteers: int, events: int) -> list:
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connection

    from runs.access.authority import authority_generate
    from runs.models import Run
    from runs.setup.forms import preset_config

    call_command("migrate", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE accounts_user, accounts_team, runs_run, runs_creditrollup RESTART IDENTITY CASCADE")
    runs = []
    for index in range(RUNS):
        public_key, private_key = authority_generate(secret=settings.AUTHORITY_ENCRYPTION_KEY)
        runs.append(Run.objects.create(name=f"Bench {index}", slug=f"bench-{index}", status=Run.Status.ACTIVE,
                                       config=preset_config("tiny").model_dump(mode="json"),
                                       authority_public_key=public_key, authority_private_key=private_key))
    per_session = max(events // volunteers, 1)
    run_ids = [run.pk for run in runs]
    statements = [
        ("teams", "INSERT INTO accounts_team (name, slug, description, created_at) "
                  "SELECT 'Team ' || t, 'team-' || t, '', now() FROM generate_series(1, 1000) t", []),
        ("volunteers", "INSERT INTO accounts_user (password, is_superuser, username, first_name, last_name, email, is_staff,"
                       " is_active, date_joined, display_name, visibility, pseudonym, team_id) "
                       "SELECT '!', false, 'bench-' || i, '', '', 'bench-' || i || '@bench.invalid', false, true, now(), '',"
                       " CASE i %% 20 WHEN 0 THEN 'hidden' WHEN 1 THEN 'anonymous' ELSE 'public' END, 'volunteer-b' || i,"
                       " CASE WHEN i %% 2 = 0 THEN 1 + i %% 1000 END FROM generate_series(1, %s) i", [volunteers]),
        ("tokens", "INSERT INTO accounts_agenttoken (user_id, name, prefix, digest, created_at, expires_at) "
                   "SELECT id, 'machine', 'dlp_', md5(id::text) || md5('x' || id), now(), now() + interval '90 days' "
                   "FROM accounts_user", []),
        ("sessions", "INSERT INTO runs_trainingsession (run_id, user_id, token_id, peer_public_key, agent_version, device,"
                     " started_at, last_seen_at, access_expires_at) "
                     "SELECT (%s::bigint[])[1 + u.id %% 3], u.id, t.id, 'ssh-rsa AAAA', 'bench', '{}',"
                     " now() - interval '1 hour' - random() * interval '7 days', now(), now() "
                     "FROM accounts_user u JOIN accounts_agenttoken t ON t.user_id = u.id", [run_ids]),
        ("events", "INSERT INTO runs_contributionevent (session_id, seq, samples, steps, local_epoch, loss,"
                   " samples_per_second, sent_at, received_at) "
                   "SELECT s.id, g, 64, 1, g / 10, 5.0, 2.0, s.started_at + g * interval '30 seconds',"
                   " s.started_at + g * interval '30 seconds' "
                   "FROM runs_trainingsession s CROSS JOIN generate_series(1, %s) g ORDER BY s.id, g", [per_session]),
    ]
    with connection.cursor() as cursor:
        for name, sql, params in statements:
            started = time.perf_counter()
            cursor.execute(sql, params)
            print(f"generated {name}: {cursor.rowcount:,} rows in {time.perf_counter() - started:.1f} s", flush=True)
        cursor.execute("ANALYZE")
    return runs


def timed(function, repeats: int) -> dict:
    durations = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        durations.append((time.perf_counter() - started) * 1000)
    durations.sort()
    return {"p50": statistics.median(durations), "p95": durations[min(len(durations) - 1, round(0.95 * len(durations)) - 1)],
            "n": repeats}


def old_board(run, window: str) -> list:
    """The board as main computed it before the rollup: grouped over the run's events per request."""
    import datetime

    from django.db.models import Count, Max, Sum
    from django.utils import timezone

    from runs.models import ContributionEvent

    events = ContributionEvent.objects.filter(session__run=run)
    if window != "all":
        events = events.filter(received_at__gte=timezone.now() - datetime.timedelta(hours=24 if window == "24h" else 168))
    grouped = (events.values("session__user")
               .annotate(samples=Sum("samples"), last_seen=Max("received_at"), machines=Count("session__token", distinct=True))
               .order_by("-samples"))
    return list(grouped)


def old_team_board(run, window: str) -> list:
    """The team board as main computed it before team totals: the volunteers' totals grouped by
    team per request (with the board's total credit for the share column, as the board does)."""
    from django.db.models import Count, Max, Sum

    from runs.credit.boards import WINDOWS
    from runs.models import RunCredit, VolunteerCredit

    samples_column, credit_column = WINDOWS[window]
    totals = (RunCredit.objects.filter(run=run) if run is not None else VolunteerCredit.objects.all()).filter(
        **{f"{samples_column}__gt": 0})
    totals.aggregate(credit=Sum(credit_column))
    teams = (
        totals.exclude(user__team=None)
        .values("user__team_id", "user__team__name", "user__team__slug")
        .annotate(samples=Sum(samples_column), credit=Sum(credit_column), credit_provisional=Sum("credit_provisional"),
                  credit_verified=Sum("credit_verified"), recent_average_credit=Sum("recent_average_credit"),
                  compute_seconds=Sum("compute_seconds"), last_seen=Max("last_seen_at"), machines=Sum("machines"),
                  members=Count("user_id"))
        .order_by("-credit", "user__team_id")[:100]
    )
    return list(teams)


def summed_board_credit(run, window: str) -> float:
    """The share's denominator as the boards computed it before run totals: a sum over all the
    run's (or all runs') volunteer totals per request."""
    from django.db.models import Sum

    from runs.credit.boards import WINDOWS
    from runs.models import RunCredit, VolunteerCredit

    samples_column, credit_column = WINDOWS[window]
    totals = (RunCredit.objects.filter(run=run) if run else VolunteerCredit.objects.all()).filter(**{f"{samples_column}__gt": 0})
    return totals.aggregate(credit=Sum(credit_column))["credit"] or 0.0


def rollup_cost(events: int, batch: int) -> None:
    """The rollup's cost with team totals: one more report from each of ``events`` sessions of
    volunteers without a team (the team totals have nothing to do), then as many from volunteers
    in teams, each rolled up and timed in batches of ``batch``."""
    from django.db import connection

    from runs.credit.rollup import credit_rollup

    seconds = {}
    for label, in_team in (("volunteers without a team", False), ("volunteers in teams", True)):
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO runs_contributionevent (session_id, seq, samples, steps, local_epoch, loss, samples_per_second,"
                " sent_at, received_at) "
                "SELECT s.id, (SELECT max(seq) FROM runs_contributionevent e WHERE e.session_id = s.id) + 1, 64, 1, 1, 5.0, 2.0,"
                " now() - interval '1 minute', now() - interval '1 minute' "
                "FROM runs_trainingsession s JOIN accounts_user u ON u.id = s.user_id "
                f"WHERE u.team_id {'IS NOT NULL' if in_team else 'IS NULL'} "
                "ORDER BY random() LIMIT %s", [events])
        started = time.perf_counter()
        consumed = credit_rollup(batch_size=batch, max_batches=10_000)
        seconds[in_team] = time.perf_counter() - started
        print(f"rollup of {consumed:,} new events from {label}: {seconds[in_team]:.1f} s "
              f"({consumed / seconds[in_team]:,.0f} events/s)", flush=True)
    print(f"ratio in teams / without a team: {seconds[True] / seconds[False]:.2f}x the time", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--volunteers", type=int, default=100_000)
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--baseline-repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=500_000, help="events per rollup transaction")
    parser.add_argument("--skip-generate", action="store_true", help="reuse the data of a previous run")
    parser.add_argument("--rollup-events", type=int, default=0,
                        help="then time the rollup of this many new events without and with team totals to keep")
    args = parser.parse_args()
    _setup_django()
    from runs.credit.boards import leaderboard_rows
    from runs.credit.rollup import credit_rollup
    from runs.models import ContributionEvent, Run, RunCredit

    runs = list(Run.objects.filter(slug__startswith="bench-").order_by("pk")) if args.skip_generate else generate(
        volunteers=args.volunteers, events=args.events)
    started = time.perf_counter()
    consumed = credit_rollup(batch_size=args.batch, max_batches=10_000)
    elapsed = time.perf_counter() - started
    print(f"rollup: {consumed:,} events in {elapsed:.1f} s ({consumed / max(elapsed, 1e-9):,.0f} events/s); "
          f"{ContributionEvent.objects.count():,} events, {RunCredit.objects.count():,} (run, volunteer) totals", flush=True)
    if args.rollup_events:
        from django.conf import settings

        rollup_cost(args.rollup_events, settings.CREDIT_ROLLUP_BATCH)
    run = runs[0]
    boards = {
        "run, by volunteer, all": lambda: leaderboard_rows(run=run, by="user", window="all"),
        "run, by volunteer, 24h": lambda: leaderboard_rows(run=run, by="user", window="24h"),
        "run, by volunteer, 7d": lambda: leaderboard_rows(run=run, by="user", window="7d"),
        "run, by team, all": lambda: leaderboard_rows(run=run, by="team", window="all"),
        "run, by team, 24h": lambda: leaderboard_rows(run=run, by="team", window="24h"),
        "all runs, by volunteer, all": lambda: leaderboard_rows(run=None, by="user", window="all"),
        "all runs, by team, 7d": lambda: leaderboard_rows(run=None, by="team", window="7d"),
    }
    print(f"\n{'board (100 rows)':32} {'p50 ms':>9} {'p95 ms':>9} {'n':>4}")
    results = {}
    for name, board in boards.items():
        results[name] = timed(board, args.repeats)
        print(f"{name:32} {results[name]['p50']:9.1f} {results[name]['p95']:9.1f} {args.repeats:4}", flush=True)
    print("\nbaseline: the same boards summing the share's denominator over the volunteers' totals per request "
          "(before run totals)")
    from runs.credit import boards

    kept = boards.board_credit
    boards.board_credit = lambda *, run, window="all": summed_board_credit(run, window)
    try:
        for name, board in boards.items():
            baseline = timed(board, args.repeats)
            print(f"summed {name:25} p50 {baseline['p50']:7.1f} ms  p95 {baseline['p95']:7.1f} ms  (n={args.repeats})  "
                  f"ratio summed/new p50: {baseline['p50'] / results[name]['p50']:,.1f}x  p95: "
                  f"{baseline['p95'] / results[name]['p95']:,.1f}x", flush=True)
    finally:
        boards.board_credit = kept
    print(f"\nbaseline: grouping the run's {ContributionEvent.objects.filter(session__run=run).count():,} events per request")
    for window, name in (("all", "run, by volunteer, all"), ("24h", "run, by volunteer, 24h")):
        baseline = timed(lambda window=window: old_board(run, window), args.baseline_repeats)
        print(f"old board {window:4} p50 {baseline['p50']:9.1f} ms  p95 {baseline['p95']:9.1f} ms  (n={args.baseline_repeats})  "
              f"ratio old/new p50: {baseline['p50'] / results[name]['p50']:,.0f}x", flush=True)
    print("\nbaseline: grouping the volunteers' totals by team per request (the team boards before team totals)")
    for board_run, window, name in ((run, "all", "run, by team, all"), (run, "24h", "run, by team, 24h"),
                                    (None, "7d", "all runs, by team, 7d")):
        baseline = timed(lambda board_run=board_run, window=window: old_team_board(board_run, window), args.baseline_repeats)
        print(f"old {name:22} p50 {baseline['p50']:7.1f} ms  p95 {baseline['p95']:7.1f} ms  (n={args.baseline_repeats})  "
              f"ratio old/new p50: {baseline['p50'] / results[name]['p50']:,.1f}x  p95: "
              f"{baseline['p95'] / results[name]['p95']:,.1f}x", flush=True)


if __name__ == "__main__":
    main()
