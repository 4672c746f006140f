"""`manage.py run_coordinator [--run SLUG]`: backbone peers for active runs, until SIGTERM or Ctrl-C."""

from django.core.management.base import BaseCommand
from hivemind.utils.logging import use_hivemind_log_handler

from peer_agent.join import StopRequest, exit_at_once
from runs.swarm.coordinator import Coordinator


class Command(BaseCommand):
    help = "Serve a hivemind backbone peer for every active run (or one run), publishing its initial peers."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--run", dest="slug", help="Serve only this run.")
        parser.add_argument("--interval", type=float, default=5.0, help="Seconds between heartbeats.")

    def handle(self, *args, slug: str | None, interval: float, **options) -> None:
        use_hivemind_log_handler("nowhere")  # hivemind's records go through the portal's handler (LOG_FORMAT)
        coordinator = Coordinator(slug=slug, interval=interval)
        # Not a bare handler: the DHT processes the coordinator forks inherit it, and one that
        # ignored SIGTERM kept the coordinator from exiting after "coordinator stopped".
        StopRequest(event=coordinator.stopping, notice="Stopping: leaving the runs' swarms (Ctrl-C again to quit now)").install()
        coordinator.serve()

    def run_from_argv(self, argv: list[str]) -> None:
        """As Django runs a command from the command line (closing the database connections after it), then an
        exit that waits for nothing more (peer_agent.join.exit_at_once): every backbone peer is shut down and
        its state kept by then. ``call_command`` runs the command without this, in the caller's process."""
        super().run_from_argv(argv)
        exit_at_once(0)
