"""DeDLOC peer agent: joins a portal run and trains with hivemind on a volunteer's machine."""

__version__ = "0.4.0"

# Agents from 0.3.0 on split a group's vector alike (the share floor of peer_agent.averaging) and
# send their membership proofs next to their gathered data, for gradients and parameters; an older
# agent in the same group would compute other parts or be refused, and the round would fail for
# everyone. From 0.4.0 on they sign their joins with their peer key (JoinRequest.key_proof). The
# portal refuses joins from older agents.
SWARM_COMPATIBLE_SINCE = "0.4.0"
