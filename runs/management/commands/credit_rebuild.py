"""`manage.py credit_rebuild [--run SLUG]`: recount every credit aggregate from the record and write
what differs (runs/credit/rebuild.py)."""

from django.core.management.base import BaseCommand, CommandError

from runs.credit.rebuild import credit_rebuild, drift_report, drift_summary
from runs.models import Run


class Command(BaseCommand):
    help = ("Recount the credit aggregates (volunteers', teams' and runs' totals, hourly buckets) from the contribution "
            "events and the epochs' decisions, and write what differs, in one transaction. Lists what it changed "
            "(every figure with -v 2).")

    def add_arguments(self, parser) -> None:
        parser.add_argument("--run", metavar="SLUG", help="only this run's rows, and its volunteers' and teams' all-runs totals")

    def handle(self, *args, run: str | None = None, verbosity: int = 1, **options) -> None:
        target = run_named(run)
        changed = credit_rebuild(run=target)
        scope = f"run {target.slug}" if target else "all runs"
        if not changed:
            self.stdout.write(f"Rebuilt the credit of {scope}: nothing differed from the record.")
            return
        rows = len({(drift.table, drift.key) for drift in changed})
        self.stdout.write(f"Rebuilt the credit of {scope}: {len(changed)} figures in {rows} rows changed.")
        for line in [*(drift_report(changed) if verbosity > 1 else []), *drift_summary(changed)]:
            self.stdout.write(line)


def run_named(slug: str | None) -> Run | None:
    if slug is None:
        return None
    run = Run.objects.filter(slug=slug).first()
    if run is None:
        raise CommandError(f'no run "{slug}": give the slug from the run\'s address (/runs/<slug>/)')
    return run
