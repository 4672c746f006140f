"""The cost of NAT: the same two peers' gradient averaging rounds, direct and through a relay.

Three hosts of the project's lab (``harness.netlab``, on ``PUBLIC_SUBNET``): host 0 runs a backbone
peer as the coordinator does (``harness.natswarm``: relaying, dial-back); hosts 1 and 2 each run a
peer that averages a gradient-sized vector (the preset model's parameter shapes, fp16 on the wire)
with ``peer_agent.averaging.FlooredGradientAverager``, as ``bench/averaging.py`` does. ``direct``:
both peers are public and dial each other. ``relayed``: each is behind a NAT of its own (iptables
MASQUERADE, nothing inbound) and they reach each other only through the backbone's circuit relay,
as agents that a dial-back found unreachable do (``peer_agent.reachability.relay_options``).

A round's time is the last peer's end of all-reduce minus the first peer's start (one clock);
matchmaking is not included; a round counts only if both peers report a group of 2. Every link is
shaped at ``--rate`` (the backbone's at ``--relay-rate``): a relayed byte crosses the relay's link
twice, in and out, so the relay's rate bounds a relayed round too. The bound printed is
max(S/B_peer, 2 S/B_relay) for the relayed case and S/B_peer for the direct one (n = 2: each peer
sends half the vector and receives the other half averaged).

Needs root (network namespaces) and iptables. Run ``python -m bench.relay --help`` from the
repository root.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.natswarm import BACKBONE_FILE, STOP_FILE
from harness.netlab import PUBLIC_SUBNET, NetLab

LAB_PREFIX = "rly"
PEERS = (1, 2)


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.relay", description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tiny", help="model preset whose gradients are averaged")
    parser.add_argument("--elements", type=int, default=None,
                        help="average a vector of this many values instead of the preset's gradients (a relayed "
                             "connection carries 128 KiB each way: peer_agent.reachability)")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per mode")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    parser.add_argument("--rate", type=float, default=100.0, help="Mbit/s of each peer's link")
    parser.add_argument("--relay-rate", type=float, default=100.0, help="Mbit/s of the backbone's link")
    parser.add_argument("--modes", default="direct,relayed", help="any of direct,relayed")
    parser.add_argument("--matchmaking-time", type=float, default=3.0)
    parser.add_argument("--averaging-timeout", type=float, default=120.0)
    # Set by the coordinator for the peer processes it starts.
    parser.add_argument("--role", choices=("coordinator", "peer"), default="coordinator")
    parser.add_argument("--index", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--workdir", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--relayed", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--total-rounds", type=int, default=0, help=argparse.SUPPRESS)
    return parser.parse_args()


# ---------------------------------------------------------------- peer (inside a namespace)

async def _state(dht, node) -> dict:
    """Runs in the DHT's process: what the daemon announces, and its connections' addresses."""
    return dict(announced=[str(maddr) for maddr in await node.p2p.get_visible_maddrs(latest=True)],
                connections={str(info.peer_id): [str(maddr) for maddr in info.addrs] for info in await node.p2p.list_peers()})


def _barrier(work: Path, name: str, index: int, timeout: float) -> None:
    (work / f"{name}_{index}").touch()
    deadline = time.monotonic() + timeout
    while not all((work / f"{name}_{i}").exists() for i in PEERS) and time.monotonic() < deadline:
        time.sleep(0.01)


def peer_main(args: argparse.Namespace) -> None:
    import torch
    from hivemind.averaging.control import AveragingStage
    from hivemind.dht import DHT
    from hivemind.utils.timed_storage import get_dht_time

    from peer_agent.averaging import FlooredGradientAverager
    from peer_agent.reachability import relay_options
    from peer_agent.training import compression_build

    torch.set_num_threads(1)
    work = Path(args.workdir)
    shapes = json.loads((work / "shapes.json").read_text())
    backbone = json.loads((work / BACKBONE_FILE).read_text())
    dht = DHT(start=True, initial_peers=backbone, host_maddrs=["/ip4/0.0.0.0/tcp/0"], startup_timeout=60,
              **relay_options(backbone, relayed=args.relayed))
    try:
        deadline = time.monotonic() + 30
        while args.relayed and time.monotonic() < deadline:  # reachable once a relay slot is reserved
            if any("/p2p-circuit" in maddr for maddr in dht.run_coroutine(_state)["announced"]):
                break
            time.sleep(0.5)
        parameters = [torch.zeros(shape, requires_grad=True) for shape in shapes]
        for parameter in parameters:
            parameter.grad = torch.randn_like(parameter)
        mm = args.matchmaking_time
        averager = FlooredGradientAverager(
            parameters, dht=dht, prefix="relay_bench_grad_averager", min_matchmaking_time=mm,
            allreduce_timeout=args.averaging_timeout, start=True, warn=False, compression=compression_build("fp16"),
            bandwidth=args.rate, target_group_size=2,
            request_timeout=min(3.0, mm / 2))
        _barrier(work, "ready", args.index, 180)
        records, first_round = [], {}
        for round_number in range(args.total_rounds):
            averager.accumulate_grads_(batch_size=1)
            control = averager.schedule_step(scheduled_time=get_dht_time() + mm, timeout=args.averaging_timeout)
            while control.stage in (AveragingStage.IDLE, AveragingStage.LOOKING_FOR_GROUP) and not control.done():
                time.sleep(0.002)
            averager.step(control=control, wait=False)
            while control.stage == AveragingStage.AWAITING_TRIGGER and not control.done():
                time.sleep(0.002)
            started = time.time()
            try:
                group = len(control.result(args.averaging_timeout))
            except Exception:  # a failed round is recorded as such
                group = 0
            records.append(dict(started=started, ended=time.time(), group=group))
            if round_number == 0:  # the path of the first round, while its connection is open
                first_round = dht.run_coroutine(_state)["connections"]
            _barrier(work, f"done{round_number}", args.index, args.averaging_timeout)
        state = dht.run_coroutine(_state)
        state["connections"] = {**first_round, **state["connections"]}
        (work / f"peer{args.index}.json").write_text(json.dumps(dict(records=records, peer_id=str(dht.peer_id), **state)))
        averager.shutdown()
    finally:
        dht.shutdown()


# ---------------------------------------------------------------- coordinator

def _python(lab: NetLab, index: int, *argv: str) -> list[str]:
    return lab.command(index, sys.executable, "-m", *argv)


def _kill(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(process.pid, signal.SIGKILL)  # p2pd and hivemind's children, whatever is left
        except ProcessLookupError:
            pass


def run_mode(args: argparse.Namespace, work: Path, mode: str) -> dict:
    """Start the backbone and both peers in a fresh lab for ``mode``; the rounds and the paths used."""
    for stale in work.glob("*"):
        if stale.name != "shapes.json":
            stale.unlink()
    rates = [args.relay_rate, args.rate, args.rate]
    nat = list(PEERS) if mode == "relayed" else []
    processes: list[subprocess.Popen] = []
    total = args.warmup + args.rounds
    with NetLab(3, rates, prefix=LAB_PREFIX, nat=nat, subnet=PUBLIC_SUBNET) as lab, (work / "peers.log").open("w") as log:
        def start(index: int, *argv: str) -> None:
            processes.append(subprocess.Popen(_python(lab, index, *argv), stdout=log, stderr=subprocess.STDOUT,
                                              start_new_session=True))
        try:
            start(0, "harness.natswarm", "backbone", str(work), "--address", lab.address(0))
            deadline = time.monotonic() + 120
            while not (work / BACKBONE_FILE).exists():
                if time.monotonic() > deadline or processes[0].poll() is not None:
                    raise RuntimeError("the backbone peer did not start; see peers.log")
                time.sleep(0.2)
            for index in PEERS:
                start(index, "bench.relay", "--role", "peer", "--index", str(index), "--workdir", str(work),
                      "--total-rounds", str(total), "--rate", str(args.rate), "--matchmaking-time", str(args.matchmaking_time),
                      "--averaging-timeout", str(args.averaging_timeout), *(["--relayed"] if nat else []))
            for process in processes[1:]:
                process.wait(timeout=total * (args.averaging_timeout + 4 * args.matchmaking_time) + 240)
        finally:
            (work / STOP_FILE).touch()
            _kill(processes)
    peers = [json.loads((work / f"peer{index}.json").read_text()) for index in PEERS]
    rounds = [dict(seconds=max(r["ended"] for r in pair) - min(r["started"] for r in pair),
                   complete=all(r["group"] == 2 for r in pair)) for pair in zip(*(peer["records"] for peer in peers))]
    first, second = peers
    path = first["connections"].get(second["peer_id"], [])
    return dict(mode=mode, seconds=[r["seconds"] for r in rounds[args.warmup:] if r["complete"]],
                incomplete=sum(not r["complete"] for r in rounds[args.warmup:]), path=path)


def coordinator_main(args: argparse.Namespace) -> None:
    if os.geteuid() != 0:
        sys.exit("needs root: the test hosts are network namespaces")
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    from bench.averaging import _numel, _shapes

    shapes = [[args.elements]] if args.elements else _shapes(args.preset)
    size = sum(_numel(shape) for shape in shapes) * 2  # fp16
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    what = f"{args.elements} values" if args.elements else args.preset
    print(f"{what}: S = {size / 1e6:.3f} MB on the wire (fp16); peers at {args.rate:g} Mbit/s, the relay at "
          f"{args.relay_rate:g} Mbit/s; {args.warmup} warm-up + {args.rounds} timed rounds\nuptime before: {uptime}")
    rows = {}
    with tempfile.TemporaryDirectory(prefix="bench-relay-") as directory:
        work = Path(directory)
        os.chmod(work, 0o755)
        (work / "shapes.json").write_text(json.dumps(shapes))
        for mode in args.modes.split(","):
            row = rows[mode] = run_mode(args, work, mode)
            bound = size * 8 / (args.rate * 1e6)
            if mode == "relayed":
                bound = max(bound, 2 * size * 8 / (args.relay_rate * 1e6))
            if not row["seconds"]:
                print(f"  {mode:<8} no complete round")
                continue
            median = statistics.median(row["seconds"])
            print(f"  {mode:<8} rounds {len(row['seconds'])} (+{row['incomplete']} incomplete)  median {median:6.2f} s  "
                  f"mean {statistics.mean(row['seconds']):6.2f} s  [{min(row['seconds']):.2f}-{max(row['seconds']):.2f}]  "
                  f"bound {bound:5.2f} s  bound/median {bound / median:5.1%}  path {' '.join(row['path']) or '?'}")
    print(f"uptime after: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    direct, relayed = rows.get("direct"), rows.get("relayed")
    if direct and relayed and direct["seconds"] and relayed["seconds"]:
        ratio = statistics.median(relayed["seconds"]) / statistics.median(direct["seconds"])
        print(f"relayed / direct (medians): {ratio:.2f}x")


def main() -> None:
    args = _parse()
    peer_main(args) if args.role == "peer" else coordinator_main(args)


if __name__ == "__main__":
    main()
