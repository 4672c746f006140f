"""DeDLOC's averaging result like for like (its claim C1: adaptive averaging 1.9x faster than ring
all-reduce on mixed hardware, ALBERT-large, 4 hardware configurations, 100 rounds).

Three strategies average the same vector, the ``large`` preset's gradients (every parameter's shape,
fp16 on the wire as the agent compresses them), over the same shaped links of the project's lab
(``harness.netlab``: 8 hosts, each its own network namespace and token buckets; hosts behind NAT
have a router of their own), in one run per configuration, in interleaved blocks so that the
machine's noise hits every strategy alike:

- ``ring``: ring all-reduce over plain TCP, pipelined in slices as NCCL's ring is
  (``bench.allreduce_tcp``); a host behind NAT dials both of its neighbours.
- ``server``: a parameter server, host 0 (a fast host), pushes and pulls overlapped slice by slice.
- ``adaptive``: the agent's averaging, hivemind's all-reduce with the bandwidth LP's partition (the
  agent's ``FlooredGradientAverager``, each host declaring its shaped rate), hosts behind NAT in
  client mode (they aggregate nothing), as ``bench.averaging``'s ``declared`` mode runs it.

Every host checks its result against the exact mean after every round (``error``: the largest
difference, fp16's rounding). A round is timed from the first host's start to the last host's end
(one clock); hivemind's matchmaking is not counted, nor is the TCP strategies' connection set-up
(made once). Each strategy's mean seconds per round comes with its 95% interval (Student's t) and
its ratio to ring all-reduce; ``bound`` is what the links allow each strategy: ring
2(n - 1)/n * S/B_min, server max(S/B_worker, (n - 1) S/B_server), adaptive the LP's partition by
``bench.averaging.round_time_model``.

Needs root (network namespaces). ``python -m bench.averaging_c1 --config hybrid --rounds 10``
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from bench import averaging
from harness.netlab import LATENCY, NetLab

STRATEGIES = ("ring", "server", "adaptive")
WRONG = 0.01  # a result this far from the exact mean is not fp16's rounding (under 4e-3 here): said at once
MODE_OF = {"ring": "ring", "server": "server", "adaptive": "declared"}  # bench.averaging's modes


@dataclass(frozen=True)
class Configuration:
    """Hosts' rates in Mbit/s (both ways), and which are behind NAT (firewalled: they accept no
    connection)."""
    rates: tuple[float, ...]
    firewalled: tuple[int, ...] = field(default=())
    about: str = ""


# The paper's setups, as close as 8 hosts on one machine allow (docs/benchmarks.md, section 6, says where
# each departs from it). Host 0 is a fast host: the DHT's bootstrap and the parameter server.
CONFIGURATIONS = {
    "homogeneous": Configuration((100,) * 8, about="8 servers at 100 Mbit/s"),
    "heterogeneous": Configuration((200, 200, 100, 100, 100, 50, 50, 50),
                                   about="8 hosts: 2 at 200 Mbit/s, 3 at 100, 3 at 50"),
    "hybrid": Configuration((250,) * 4 + (25,) * 4, about="4 servers at 250 Mbit/s, 4 workstations at 25"),
    "firewalled": Configuration((250,) * 4 + (25,) * 4, firewalled=(5, 7),
                                about="hybrid, 2 of the workstations behind NAT"),
}


def _parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.averaging_c1", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="hybrid",
                        help=f"comma-separated, any of {','.join(CONFIGURATIONS)}, or all")
    parser.add_argument("--strategies", default=",".join(STRATEGIES), help=f"any of {','.join(STRATEGIES)}")
    parser.add_argument("--rounds", type=int, default=30, help="timed rounds per strategy and configuration")
    parser.add_argument("--blocks", type=int, default=3,
                        help="the rounds are run in this many blocks, strategies taking turns")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds at the start of each block")
    parser.add_argument("--preset", default="large", help="the model preset whose gradients are averaged")
    parser.add_argument("--lab-prefix", default="cone", help="name prefix of the lab's network namespaces")
    parser.add_argument("--queue", default=LATENCY,
                        help="the longest a packet waits in a link's token bucket (tc's tbf latency), e.g. 50ms")
    parser.add_argument("--matchmaking-time", type=float, default=3.0, help="hivemind's, for the adaptive strategy")
    parser.add_argument("--averaging-timeout", type=float, default=180.0)
    return parser.parse_args(argv)


def ring_order(hosts: int, firewalled: tuple[int, ...]) -> list[int]:
    """The hosts in a ring order where no two hosts behind NAT are neighbours (they could not connect)."""
    open_hosts = [host for host in range(hosts) if host not in firewalled]
    if len(firewalled) > len(open_hosts):
        raise ValueError("more hosts behind NAT than open ones: no ring keeps them apart")
    order = []
    for position, host in enumerate(open_hosts):
        order.append(host)
        if position < len(firewalled):
            order.append(firewalled[position])
    return order


def bounds(size: float, configuration: Configuration, shares: list[float]) -> dict[str, float]:
    """Seconds each strategy's round takes at the least if every link runs at its rate."""
    rates, n = list(configuration.rates), len(configuration.rates)
    megabits = size * 8 / 1e6
    return dict(
        ring=2 * (n - 1) / n * megabits / min(rates),
        server=max(max(megabits / rate for rate in rates[1:]), (n - 1) * megabits / rates[0]),
        adaptive=averaging.round_time_model(size, rates, shares),
    )


def interval(seconds: list[float]) -> tuple[float, float]:
    """The mean and the half-width of its 95% interval (Student's t)."""
    from scipy import stats

    mean = statistics.mean(seconds)
    if len(seconds) < 2:
        return mean, float("nan")
    return mean, stats.t.ppf(0.975, len(seconds) - 1) * statistics.stdev(seconds) / len(seconds) ** 0.5


def _exact_mean_write(work: Path, shapes: list[list[int]], hosts: int) -> None:
    import numpy as np
    import torch

    total = None
    for host in range(hosts):
        flat = torch.cat([gradient.flatten() for gradient in averaging.gradients(shapes, host)]).double()
        total = flat if total is None else total + flat
    np.save(work / "mean.npy", (total / hosts).float().numpy())


def run(args: argparse.Namespace) -> list[dict]:
    if os.geteuid() != 0:
        sys.exit("needs root: the test hosts are network namespaces")
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    names = list(CONFIGURATIONS) if args.config == "all" else args.config.split(",")
    strategies = args.strategies.split(",")
    unknown = [name for name in names if name not in CONFIGURATIONS] + [s for s in strategies if s not in STRATEGIES]
    if unknown:
        sys.exit(f"unknown: {', '.join(unknown)}")
    # What bench.averaging's peers and run_configuration read from their arguments.
    peer_args = argparse.Namespace(compression="fp16", matchmaking_time=args.matchmaking_time,
                                   averaging_timeout=args.averaging_timeout, slow_declares=None)
    shapes = averaging._shapes(args.preset)
    elements = sum(averaging._numel(shape) for shape in shapes)
    size = elements * 2
    print(f"uptime before: {averaging._uptime()}")
    print(f"{args.preset}: {elements:,} elements, S = {size / 1e6:.2f} MB on the wire (fp16); per strategy and "
          f"configuration {args.rounds} timed rounds in {args.blocks} blocks, each after {args.warmup} warm-up")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-averaging-c1-") as directory:
        work = Path(directory)
        os.chmod(work, 0o755)
        (work / "shapes.json").write_text(json.dumps(shapes))
        for name in names:
            configuration = CONFIGURATIONS[name]
            n = len(configuration.rates)
            clients = [host in configuration.firewalled for host in range(n)]
            _exact_mean_write(work, shapes, n)
            shares = averaging._fractions(elements, [0.0 if client else rate
                                                     for client, rate in zip(clients, configuration.rates)],
                                          floored=True)
            bound = bounds(size, configuration, shares)
            print(f"\n{name}: {configuration.about}; adaptive shares {'/'.join(f'{f:.2f}' for f in shares)}")
            seconds = {strategy: [] for strategy in strategies}
            errors = {strategy: [] for strategy in strategies}
            with NetLab(n, list(configuration.rates), prefix=args.lab_prefix, nat=configuration.firewalled,
                        latency=args.queue) as lab:
                (work / "links.json").write_text(json.dumps(dict(
                    addresses=[lab.address(host) for host in range(n)], server=0,
                    order=ring_order(n, configuration.firewalled), firewalled=list(configuration.firewalled))))
                per_block = [args.rounds // args.blocks + (block < args.rounds % args.blocks)
                             for block in range(args.blocks)]
                for block, timed in enumerate(per_block):
                    for strategy in strategies:
                        rounds = averaging.run_configuration(
                            peer_args, work, lab, case=name, mode=MODE_OF[strategy], rates=list(configuration.rates),
                            clients=clients, auxiliary=[False] * n, total_rounds=args.warmup + timed)
                        complete = [r for r in rounds[args.warmup:] if r["complete"]]
                        for number, r in enumerate(rounds[args.warmup:], start=1):
                            if r["error"] is not None and r["error"] > WRONG:
                                print(f"  ! block {block + 1} {strategy} round {number}: a host's result is "
                                      f"{r['error']:.3g} from the exact mean", flush=True)
                        seconds[strategy] += [r["seconds"] for r in complete]
                        errors[strategy] += [r["error"] for r in complete if r["error"] is not None]
                        print(f"  block {block + 1}/{args.blocks} {strategy:<8} rounds {len(complete)} of {timed}"
                              f"  mean {statistics.mean([r['seconds'] for r in complete]) if complete else float('nan'):6.2f} s"
                              f"  largest error {max((r['error'] or 0 for r in complete), default=float('nan')):.2e}"
                              f"  load {averaging._uptime().split('average:')[1].split(',')[0].strip()}", flush=True)
            for strategy in strategies:
                rows.append(dict(config=name, strategy=strategy, seconds=seconds[strategy],
                                 error=max(errors[strategy], default=None), bound=bound[strategy]))
    print(f"\nuptime after: {averaging._uptime()}")
    summary_print(rows)
    return rows


def summary_print(rows: list[dict]) -> None:
    print("\nconfig         strategy   rounds   mean s   95% interval     bound s   of bound   ring's time / this"
          "   largest error")
    ring = {row["config"]: row for row in rows if row["strategy"] == "ring" and row["seconds"]}
    for row in rows:
        if not row["seconds"]:
            print(f"{row['config']:<14} {row['strategy']:<9}  no complete round")
            continue
        mean, half = interval(row["seconds"])
        ratio = ""
        if row["config"] in ring:
            ring_mean, ring_half = interval(ring[row["config"]]["seconds"])
            ratio = (f"{ring_mean / mean:5.2f}x [{(ring_mean - ring_half) / (mean + half):.2f}-"
                     f"{(ring_mean + ring_half) / (mean - half):.2f}]")
        error = f"{row['error']:.1e}" if row["error"] is not None else "-"
        print(f"{row['config']:<14} {row['strategy']:<9} {len(row['seconds']):6d} {mean:8.2f}   "
              f"{mean - half:6.2f}-{mean + half:6.2f}   {row['bound']:7.2f}   {row['bound'] / mean:7.1%}   "
              f"{ratio:<22} {error}")


def main(argv: list[str] | None = None) -> None:
    run(_parse(argv))


if __name__ == "__main__":
    main()
