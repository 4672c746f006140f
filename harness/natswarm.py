"""Peers for tests and benchmarks of volunteers behind NAT, each run as a process inside a host of
``harness.netlab`` (``python -m harness.natswarm ROLE WORKDIR ...``):

- ``backbone``: a DHT peer as the coordinator's backbone peers run it: relaying, serving dial-back
  (``peer_agent.reachability``); it writes its multiaddrs to ``WORKDIR/backbone.json`` and lives until
  ``WORKDIR/stop`` appears;
- ``probe``: the agent's reachability check against that backbone; prints its outcome as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

BACKBONE_FILE = "backbone.json"
STOP_FILE = "stop"


def backbone_main(work: Path, address: str) -> None:
    from hivemind.dht import DHT

    from peer_agent.reachability import dialback_install, relay_options

    dht = DHT(start=True, host_maddrs=["/ip4/0.0.0.0/tcp/0"], startup_timeout=120, **relay_options([], relayed=False))
    try:
        dialback_install(dht)
        maddrs = [str(maddr) for maddr in dht.get_visible_maddrs() if f"/{address}/" in str(maddr)]
        (work / f"{BACKBONE_FILE}.tmp").write_text(json.dumps(maddrs))
        (work / f"{BACKBONE_FILE}.tmp").rename(work / BACKBONE_FILE)
        while not (work / STOP_FILE).exists():
            time.sleep(0.2)
    finally:
        dht.shutdown()


def probe_main(work: Path) -> None:
    from peer_agent.reachability import reachability_probe

    backbones = json.loads((work / BACKBONE_FILE).read_text())
    outcome = reachability_probe(backbones, host_maddrs=["/ip4/0.0.0.0/tcp/0"])
    print(json.dumps(asdict(outcome)), flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m harness.natswarm", description=__doc__.split("\n\n")[0])
    parser.add_argument("role", choices=("backbone", "probe"))
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--address", default="ip4", help="backbone: keep the multiaddrs that contain /ADDRESS/")
    args = parser.parse_args(argv)
    if args.role == "backbone":
        backbone_main(args.workdir, args.address)
    else:
        probe_main(args.workdir)


if __name__ == "__main__":
    sys.exit(main())
