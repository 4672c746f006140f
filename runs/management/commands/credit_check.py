"""`manage.py credit_check [--run SLUG] [--history]`: compare the stored credit aggregates with a
recount from the record, writing nothing; exit status 1 when they drifted (runs/credit/rebuild.py)."""

from django.core.management.base import BaseCommand, CommandError

from runs.credit.rebuild import credit_check, drift_report, drift_summary
from runs.management.commands.credit_rebuild import run_named

SHOWN = 50


class Command(BaseCommand):
    help = ("Compare the stored credit aggregates with a recount from the contribution events and the epochs' "
            "decisions, without writing. Names each drifted figure (the first 50; all with -v 2) and exits with "
            "status 1 when there is any.")

    def add_arguments(self, parser) -> None:
        parser.add_argument("--run", metavar="SLUG", help="only this run's rows, and its volunteers' and teams' all-runs totals")
        parser.add_argument("--history", action="store_true",
                            help="also compare the hourly buckets, RAC and teams' shares with their recount: these "
                                 "differ legitimately where the rollup fell behind a team change, an epoch was judged "
                                 "twice or RAC decayed idle")

    def handle(self, *args, run: str | None = None, history: bool = False, verbosity: int = 1, **options) -> None:
        target = run_named(run)
        drifts = credit_check(run=target, history=history)
        scope = f"run {target.slug}" if target else "all runs"
        if not drifts:
            self.stdout.write(f"No drift: the credit aggregates of {scope} agree with the record.")
            return
        rows = len({(drift.table, drift.key) for drift in drifts})
        self.stdout.write(f"Credit drift in {scope}: {len(drifts)} figures in {rows} rows.")
        for line in [*drift_report(drifts, limit=None if verbosity > 1 else SHOWN), *drift_summary(drifts)]:
            self.stdout.write(line)
        raise CommandError("the credit aggregates drifted from the record; `manage.py credit_rebuild` rewrites them",
                           returncode=1)
