"""Peers for tests and benchmarks of volunteers behind NAT, each run as a process inside a host of
``harness.netlab`` (``python -m harness.natswarm ROLE WORKDIR ...``):

- ``backbone``: a DHT peer as the coordinator's backbone peers run it: relaying, serving dial-back
  (``peer_agent.reachability``); it writes its multiaddrs to ``WORKDIR/backbone.json`` and lives until
  ``WORKDIR/stop`` appears;
- ``probe``: the agent's reachability check against that backbone; prints its outcome as JSON;
- ``trainer``: an agent's ``Trainer`` (``WORKDIR/config.json``, ``tokenizer.json``, ``corpus.txt``),
  direct or relayed through the backbone, that trains to ``--epochs`` and writes what it saw to
  ``WORKDIR/trainer<I>.json``: the peers of each gradient round, the addresses of its connections
  (``/p2p-circuit`` ones went through a relay) and the steps that did not average.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

BACKBONE_FILE = "backbone.json"
STOP_FILE = "stop"


def backbone_main(work: Path, address: str) -> None:
    # each role loads only what it runs: a probe or a backbone never pays for a trainer's torch and transformers
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
    # each role loads only what it runs: a probe or a backbone never pays for a trainer's torch and transformers
    from peer_agent.reachability import reachability_probe

    backbones = json.loads((work / BACKBONE_FILE).read_text())
    outcome = reachability_probe(backbones, host_maddrs=["/ip4/0.0.0.0/tcp/0"])
    print(json.dumps(asdict(outcome)), flush=True)


async def _connections(dht, node) -> dict[str, list[str]]:
    """Runs in the DHT's process: each connected peer's connection addresses."""
    return {str(info.peer_id): [str(maddr) for maddr in info.addrs] for info in await node.p2p.list_peers()}


async def _announced(dht, node) -> list[str]:
    """Runs in the DHT's process: the addresses the daemon announces now (relayed ones included)."""
    return [str(maddr) for maddr in await node.p2p.get_visible_maddrs(latest=True)]


def _ask(trainer, coroutine, default, timeout: float = 15.0):
    """Run ``coroutine`` in the trainer's DHT process; ``default`` when it has not answered in ``timeout`` s."""
    try:
        return trainer.dht.run_coroutine(coroutine, return_future=True).result(timeout=timeout)
    except TimeoutError:
        return default


def trainer_main(work: Path, index: int, epochs: int, relayed: bool, deadline_s: float, together: int) -> None:
    deadline = time.monotonic() + deadline_s
    # A start, step or shutdown stuck past the deadline: the threads' stacks go to the log and the process exits.
    faulthandler.dump_traceback_later(deadline_s + 60, exit=True)
    # each role loads only what it runs: a probe or a backbone never pays for a trainer's torch and transformers
    import torch

    from harness.swarm import STEP_TIME_S, optimizer_watch
    from peer_agent.protocol import RunConfig
    from peer_agent.tokenizer import tokenizer_load
    from peer_agent.training import SwarmUnreachable, Trainer, TrainerSetup

    torch.set_num_threads(1)
    config = RunConfig.model_validate_json((work / "config.json").read_text())
    backbones = json.loads((work / BACKBONE_FILE).read_text())
    setup = TrainerSetup(config=config, run_id="nat_run", initial_peers=backbones, relayed=relayed, seed=index,
                         host_maddrs=["/ip4/0.0.0.0/tcp/0"], data_files=[str(work / "corpus.txt")])
    try:
        trainer = Trainer(setup, tokenizer_load(work / "tokenizer.json"))
    except SwarmUnreachable:  # the daemon's first dial through the NAT timed out on a loaded host: as a volunteer would, again
        trainer = Trainer(setup, tokenizer_load(work / "tokenizer.json"))
    rounds, anomalies, connections, maddrs, asked_after = [], [], {}, [], 0
    optimizer_watch(trainer, on_anomaly=lambda what, epoch: anomalies.append([what, epoch]),
                    on_group=lambda peers, epoch: rounds.append([epoch, sorted(str(peer) for peer in peers)]))
    try:
        (work / f"ready{index}").touch()
        # Train only once ``together`` trainers are ready: one whose start took a second attempt at the
        # state download (peer_agent.training.state_download_timeout) would find the others done.
        while len(list(work.glob("ready*"))) < together and time.monotonic() < deadline:
            time.sleep(0.2)
        while trainer.optimizer.local_epoch < epochs and time.monotonic() < deadline:
            time.sleep(STEP_TIME_S)
            trainer.step()
            if len(rounds) > asked_after:  # after each round, while its connections are still open
                asked_after = len(rounds)  # (on a loaded host the first round may have found no partner)
                connections = {**connections, **_ask(trainer, _connections, {})}
                maddrs = maddrs or _ask(trainer, _announced, [])
        # The daemon may not answer once the other peer is gone: what it said after the first round stands.
        connections = {**connections, **_ask(trainer, _connections, {})}
        maddrs = _ask(trainer, _announced, []) or maddrs
        peer_id = str(trainer.dht.peer_id)
    finally:
        trainer.shutdown()
    result = dict(peer_id=peer_id, maddrs=maddrs, epoch=trainer.optimizer.local_epoch, rounds=rounds,
                  anomalies=anomalies, connections=connections)
    (work / f"trainer{index}.json").write_text(json.dumps(result))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m harness.natswarm", description=__doc__.split("\n\n")[0])
    parser.add_argument("role", choices=("backbone", "probe", "trainer"))
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--address", default="ip4", help="backbone: keep the multiaddrs that contain /ADDRESS/")
    parser.add_argument("--index", type=int, default=0, help="trainer: its number (and data seed)")
    parser.add_argument("--epochs", type=int, default=3, help="trainer: train until this local epoch")
    parser.add_argument("--relayed", action="store_true", help="trainer: reachable only through the backbone's relay")
    parser.add_argument("--deadline", type=float, default=150.0, help="trainer: give up training this many s after start")
    parser.add_argument("--together", type=int, default=1, help="trainer: start training once this many trainers are ready")
    args = parser.parse_args(argv)
    if args.role == "backbone":
        backbone_main(args.workdir, args.address)
    elif args.role == "probe":
        probe_main(args.workdir)
    else:
        trainer_main(args.workdir, args.index, args.epochs, args.relayed, args.deadline, args.together)


if __name__ == "__main__":
    sys.exit(main())
