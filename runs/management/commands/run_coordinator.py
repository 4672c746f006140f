"""`manage.py run_coordinator [--run SLUG]`: backbone peers for active runs, until SIGTERM or Ctrl-C."""

import signal

from django.core.management.base import BaseCommand

from runs.coordinator import Coordinator


class Command(BaseCommand):
    help = "Serve a hivemind backbone peer for every active run (or one run), publishing its initial peers."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--run", dest="slug", help="Serve only this run.")
        parser.add_argument("--interval", type=float, default=5.0, help="Seconds between heartbeats.")

    def handle(self, *args, slug: str | None, interval: float, **options) -> None:
        coordinator = Coordinator(slug=slug, interval=interval)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: coordinator.stopping.set())
        coordinator.serve()
