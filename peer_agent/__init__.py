"""DeDLOC peer agent: joins a portal run and trains with hivemind on a volunteer's machine."""

from peer_agent.protocol import SWARM_COMPATIBLE_SINCE

__version__ = "0.16.0"
__all__ = ["SWARM_COMPATIBLE_SINCE", "__version__"]
