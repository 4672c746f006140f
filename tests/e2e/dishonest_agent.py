"""A dishonest peer agent, for tests only: it trains and publishes its DHT records honestly but
reports twice the samples it trained to the portal. Run as ``python -m tests.e2e.dishonest_agent join ...``."""

import sys

import peer_agent.join
from peer_agent import cli
from peer_agent.reporter import Reporter


class DoublingReporter(Reporter):
    def report(self, *, samples: int, **fields):
        return super().report(samples=2 * samples, **fields)


if __name__ == "__main__":
    peer_agent.join.Reporter = DoublingReporter
    sys.exit(cli.main())
