"""``python -m peer_agent`` runs the ``peer-agent`` command."""

from peer_agent.cli import run

run()
