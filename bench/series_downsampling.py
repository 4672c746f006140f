"""Time of a run's chart series: time buckets averaged in the database (`runs.swarm.series.series_points`,
what `GET /api/v1/runs/{slug}/series` does) against the baseline of reading every reading into
Python and bucketing it there in one pass. Both are timed in the same run on the same rows.

Uses the database of the settings (``DATABASE_URL``; SQLite by default): it creates one run with
``--readings`` monitor readings 5 s apart, times each way ``--repeat`` times, and deletes the run.

    DATABASE_URL=postgres://… .venv/bin/python -m bench.series_downsampling --readings 100000
"""

import argparse
import datetime
import os
import statistics
import time


def _python_buckets(run, *, max_points: int) -> int:
    """The baseline: every row into Python, then one pass of bucket sums."""
    from runs.models import RunSample

    rows = list(RunSample.objects.filter(run=run).order_by("at").values_list("at", "samples_per_second", "alive_peers", "loss"))
    first, last = rows[0][0].timestamp(), rows[-1][0].timestamp()
    width = (last - first) / max_points
    sums: dict[int, list[float]] = {}
    for at, rate, peers, loss in rows:
        bucket = min(int((at.timestamp() - first) / width), max_points - 1)
        total = sums.setdefault(bucket, [0.0, 0.0, 0.0, 0])
        total[0] += rate
        total[1] += peers
        total[2] += loss or 0.0
        total[3] += 1
    return len(sums)


def _timed(function, repeat: int) -> tuple[float, int]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        points = function()
        times.append(time.perf_counter() - start)
    return statistics.median(times), points


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readings", type=int, default=100_000)
    parser.add_argument("--max-points", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    import django

    django.setup()
    from django.conf import settings
    from django.db import connection

    from runs.access.authority import authority_generate
    from runs.models import Run, RunSample
    from runs.swarm.series import series_points

    public_key, private_key = authority_generate(secret=settings.AUTHORITY_ENCRYPTION_KEY)
    run = Run.objects.create(name="bench series", slug=f"bench-series-{os.getpid()}", status=Run.Status.ACTIVE,
                             authority_public_key=public_key, authority_private_key=private_key)
    try:
        start = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
        RunSample.objects.bulk_create(
            (RunSample(run=run, at=start + datetime.timedelta(seconds=5 * i), global_epoch=i // 100,
                       samples_per_second=100.0 + i % 17, alive_peers=3 + i % 5, loss=5.0 - i / args.readings)
             for i in range(args.readings)),
            batch_size=5000,
        )
        version = connection.Database.sqlite_version if connection.vendor == "sqlite" else connection.pg_version
        database = f"{connection.vendor} {version}"
        in_db, points = _timed(lambda: len(series_points(run=run, max_points=args.max_points)["at"]), args.repeat)
        in_python, python_points = _timed(lambda: _python_buckets(run, max_points=args.max_points), args.repeat)
        assert points == python_points == args.max_points, (points, python_points)
        print(f"database: {database}; readings: {args.readings:,}; max_points: {args.max_points}; median of {args.repeat}")
        print(f"{'way':<34}{'seconds':>10}{'points':>8}")
        print(f"{'buckets in the database':<34}{in_db:>10.3f}{points:>8}")
        print(f"{'baseline: all rows, Python pass':<34}{in_python:>10.3f}{python_points:>8}")
        print(f"baseline / database: {in_python / in_db:.1f}x")
    finally:
        run.delete()


if __name__ == "__main__":
    main()
