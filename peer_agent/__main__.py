"""``python -m peer_agent`` runs the ``peer-agent`` command."""

import sys

from peer_agent.cli import main

sys.exit(main())
