"""Averaging at the bandwidth limit: hivemind all-reduce rounds on 4 shaped test hosts.

Four peers, each in its own network namespace (``harness.netlab``: a bridge, and a tc token bucket
per host limiting its upload and its download), average a gradient-sized vector with
the gradient averager built with the options the agent gives it in
``peer_agent.training.optimizer_build``:

- the same class (``peer_agent.averaging.FlooredGradientAverager``: hivemind's ``GradientAverager``
  that keeps every aggregating peer's share at 1% or more) over tensors of the model's parameter
  shapes (``peer_agent.model.model_build`` of the preset, built once by the coordinator);
- ``bandwidth`` (declared Mbit/s), ``target_group_size`` (the config default, 16),
  ``request_timeout=min(3, matchmaking_time / 2)``, ``compression`` = the run's grad compression
  (fp16 by default: 2 bytes per element on the wire), ``client_mode`` equal to the DHT's,
  ``min_matchmaking_time`` = matchmaking time, ``allreduce_timeout`` = averaging timeout,
  prefix ``<run>_grad_averager``, DHT listening on ``/ip4/0.0.0.0/tcp/0`` as the agent does;
- not the agent's: no ``hivemind.Optimizer`` around it (no progress tracker, no state averager, no
  training), so a round starts when every peer asks for one, not when the swarm reaches its batch.

Each round a peer schedules a step, waits until its group is formed, triggers it (as the Optimizer
does with a pre-scheduled group) and records when its all-reduce started and ended. A round's time
is the last peer's end minus the first peer's start (all hosts share one clock); matchmaking is not
included. A round counts only if every peer reports a group of 4; peers wait for each other after
every round (a file barrier) so that all 4 meet again.

Cases (host 3 is the odd one): ``homogeneous`` all at ``--fast-rate``; ``slow`` host 3 at
``--slow-rate``; ``client`` all at the fast rate, host 3 firewalled (``client_mode=True`` on its DHT
and averager: it aggregates nothing). Each case is run with every peer declaring its shaped rate
(``declared``; the rate given to tc, not measured) and with every peer declaring the same rate
(``equal``: equal shares); ``hivemind`` is ``declared`` with hivemind's own ``GradientAverager``,
whose partition may leave a slow peer no share. ``tcp`` is the wire's ceiling for the ``declared``
partition, without hivemind: every host sends every other host, over plain TCP and all at once,
the bytes the all-reduce would (its vector part to each owner, and its own averaged part back), so
``tcp``'s round over the bound is what this lab's links and TCP allow, and ``declared`` over ``tcp``
is what hivemind's all-reduce protocol itself costs. ``bench.averaging_c1`` adds the modes ``ring``
and ``server``, the baselines DeDLOC compared with, really averaging over TCP (``bench.allreduce_tcp``),
and checks every mode's result against the exact mean. The bound is the time of the optimal partition (hivemind's own
``load_balance_peers`` given the true rates, clients at 0): peer i with share f_i sends
S(1 - f_i) as a client and (n - 1) f_i S as an aggregator and receives as much, so a round takes at
least max_i S (1 + (n - 2) f_i) / B_i; at equal rates that is 2(n-1)/n * S/B. The same formula gives
the time each partition actually used implies ("model").

``hybrid`` is DeDLOC's mixed case: ``--volunteers`` hosts at ``--volunteer-rate`` plus one auxiliary
peer (an aggregator: ``auxiliary=True``, hivemind's ``AveragingMode.AUX``, as ``peer-agent aggregate``
runs it) at ``--aux-rate``; it sends no vector of its own and reduces the part the partition gives
it. ``volunteers`` is the same volunteers without it. In ``tcp`` mode an auxiliary only receives its
part's slices and returns the averaged part. ``--peers 2,4,8`` runs the ``homogeneous``, ``slow`` and
``client`` cases at each group size, to show how the gap to the bound grows with n.

Needs root (network namespaces). Run ``python -m bench.averaging --help`` from the repository root.
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

from harness.netlab import NetLab

N_PEERS = 4  # the default group size of the homogeneous, slow and client cases
LAB_PREFIX = "avg"  # the namespaces avg0..avg3 and avgbr
LAB_ADDRESS_PREFIX = "/ip4/10.77.0.1/"
CASES = ("homogeneous", "slow", "client", "hybrid", "volunteers")
MODES = ("declared", "equal", "hivemind", "tcp")
TCP_MODES = ("tcp", "ring", "server")  # no hivemind, no DHT: the hosts' addresses are known
TCP_PORT = 47123


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.averaging", description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", default="tiny,large", help="model presets whose gradients are averaged")
    parser.add_argument("--cases", default="homogeneous,slow,client", help=f"any of {','.join(CASES)}")
    parser.add_argument("--peers", default=str(N_PEERS),
                        help="group sizes n of the homogeneous, slow and client cases, e.g. 2,4,8")
    parser.add_argument("--volunteers", type=int, default=4, help="volunteer hosts of the hybrid and volunteers cases")
    parser.add_argument("--volunteer-rate", type=float, default=20.0, help="Mbit/s of each volunteer (hybrid case)")
    parser.add_argument("--aux-rate", type=float, default=500.0, help="Mbit/s of the auxiliary peer (hybrid case)")
    parser.add_argument("--lab-prefix", default=LAB_PREFIX, help="name prefix of the lab's network namespaces")
    parser.add_argument("--modes", default=",".join(MODES), help=f"any of {','.join(MODES)}")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per configuration")
    parser.add_argument("--large-rounds", type=int, default=None, help="timed rounds for the large preset")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    parser.add_argument("--fast-rate", type=float, default=100.0, help="Mbit/s of every host")
    parser.add_argument("--slow-rate", type=float, default=20.0, help="Mbit/s of host 3 in the slow case")
    parser.add_argument("--slow-declares", type=float, default=None,
                        help="Mbit/s host 3 declares in the slow case's declared mode (default: its shaped rate)")
    parser.add_argument("--compression", choices=("fp16", "none"), default="fp16",
                        help="gradient compression (the agent's default is fp16)")
    parser.add_argument("--matchmaking-time", type=float, default=3.0)
    parser.add_argument("--averaging-timeout", type=float, default=180.0)
    # Set by the coordinator for the peer processes it starts.
    parser.add_argument("--role", choices=("coordinator", "peer"), default="coordinator")
    parser.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--workdir", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--bandwidth", type=float, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--client-mode", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--auxiliary", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--n-peers", type=int, default=N_PEERS, help=argparse.SUPPRESS)
    parser.add_argument("--hivemind-averager", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tcp", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tcp-strategy", choices=("ring", "server"), default=None, help=argparse.SUPPRESS)
    parser.add_argument("--initial-peer", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--total-rounds", type=int, default=0, help=argparse.SUPPRESS)
    return parser.parse_args()


# ---------------------------------------------------------------- peer (inside a namespace)

def _barrier(work: Path, round_number: int, index: int, timeout: float, n: int) -> None:
    """Every peer starts round r + 1 together, as the Optimizer's epochs make them do: without this
    the fast hosts finish first and average among themselves while the slow one is busy."""
    (work / f"done{round_number}_{index}").touch()
    deadline = time.monotonic() + timeout
    while not all((work / f"done{round_number}_{i}").exists() for i in range(n)):
        if time.monotonic() > deadline:
            break
        time.sleep(0.01)


def tcp_peer_main(args: argparse.Namespace) -> None:
    """The ``tcp`` mode's peer: per round, send each other host ``S (f_j + f_i)`` bytes over a TCP
    connection of its own (all at once) and read as much from each; the round ends for this host
    when everything it sends and receives has crossed. An auxiliary host sends no slices of its own
    (``S f_j`` drops from what it sends, and ``S f_i`` from what it receives)."""
    import socket
    import threading

    work = Path(args.workdir)
    shares, size, auxiliary = json.loads((work / "tcp.json").read_text())
    n = len(shares)
    out = work / f"peer{args.index}.jsonl"
    chunk = memoryview(bytes(1 << 20))
    listener = socket.create_server(("0.0.0.0", TCP_PORT), backlog=n * 4)
    (work / f"ready{args.index}").touch()
    while not (work / "go").exists():
        time.sleep(0.05)

    def send(peer: int, count: int) -> None:
        with socket.create_connection((f"10.77.0.{peer + 1}", TCP_PORT), timeout=args.averaging_timeout) as connection:
            while count > 0:
                count -= connection.send(chunk[:min(count, len(chunk))])

    def receive(connection: socket.socket) -> None:
        buffer = bytearray(1 << 20)
        with connection:
            while connection.recv_into(buffer):
                pass

    for round_number in range(args.total_rounds):
        started = time.time()
        me = args.index
        threads = [threading.Thread(target=send, args=(peer, _tcp_bytes(size, shares, auxiliary, me, peer)))
                   for peer in range(n) if peer != me and _tcp_bytes(size, shares, auxiliary, me, peer)]
        for thread in threads:
            thread.start()
        for _ in range(sum(1 for peer in range(n) if peer != me and _tcp_bytes(size, shares, auxiliary, peer, me))):
            threads.append(threading.Thread(target=receive, args=(listener.accept()[0],)))
            threads[-1].start()
        for thread in threads:
            thread.join()
        ended = time.time()
        with out.open("a") as file:
            file.write(json.dumps(dict(round=round_number, triggered=started, started=started, ended=ended,
                                       group=n, problem="")) + "\n")
        _barrier(work, round_number, args.index, args.averaging_timeout, n)
    listener.close()


def gradients(shapes: list[list[int]], index: int) -> list:
    """Host ``index``'s gradients, the same in every process that asks (the exact mean is computed from
    them)."""
    import torch

    generator = torch.Generator().manual_seed(index)
    return [torch.randn(shape, generator=generator) for shape in shapes]


def _mean_load(work: Path):
    """The exact mean of the senders' gradients, flat, if the coordinator wrote it (``mean.npy``)."""
    import numpy as np
    import torch

    path = work / "mean.npy"
    return torch.from_numpy(np.load(path)) if path.exists() else None


def tcp_average_peer_main(args: argparse.Namespace) -> None:
    """The ``ring`` and ``server`` modes' peer: averages its gradients with the others by ring all-reduce or
    through host 0, over plain TCP (``bench.allreduce_tcp``), and checks the result against the exact mean."""
    import socket

    import torch

    from bench.allreduce_tcp import connect, ring_average, server_average

    work = Path(args.workdir)
    shapes = json.loads((work / "shapes.json").read_text())
    plan = json.loads((work / "links.json").read_text())
    n, out = len(plan["addresses"]), work / f"peer{args.index}.jsonl"
    vector = torch.cat([gradient.flatten() for gradient in gradients(shapes, args.index)]).numpy()
    mean = _mean_load(work).numpy()
    listener = socket.create_server(("0.0.0.0", TCP_PORT), backlog=n * 2)
    (work / f"ready{args.index}").touch()
    while not (work / "go").exists():
        time.sleep(0.05)
    addresses = [(address, TCP_PORT) for address in plan["addresses"]]
    links = connect(args.index, addresses, listener, strategy=args.tcp_strategy, order=plan["order"],
                    server=plan["server"], firewalled=plan["firewalled"], timeout=args.averaging_timeout)
    try:
        for round_number in range(args.total_rounds):
            started = time.time()
            if args.tcp_strategy == "ring":
                result = ring_average(vector, args.index, plan["order"], links)
            else:
                result = server_average(vector, args.index, plan["server"], n, links)
            ended = time.time()
            with out.open("a") as file:
                file.write(json.dumps(dict(round=round_number, triggered=started, started=started, ended=ended,
                                           group=n, problem="", error=float(abs(result - mean).max()))) + "\n")
            _barrier(work, round_number, args.index, args.averaging_timeout, n)
    finally:
        links.close()
        listener.close()


def _tcp_bytes(size: int, shares: list[float], auxiliary: list[bool], sender: int, receiver: int) -> int:
    """Bytes host ``sender`` sends ``receiver`` in a round: its slice of the receiver's part (unless the
    sender is auxiliary) and the averaged part it owns (unless the receiver is auxiliary)."""
    return int(size * (shares[receiver] * (not auxiliary[sender]) + shares[sender] * (not auxiliary[receiver])))


def peer_main(args: argparse.Namespace) -> None:
    import torch
    from hivemind.averaging.control import AveragingStage
    from hivemind.dht import DHT
    from hivemind.optim.grad_averager import GradientAverager
    from hivemind.utils.timed_storage import get_dht_time

    from peer_agent.averaging import FlooredGradientAverager
    from peer_agent.training import compression_build

    torch.set_num_threads(1)
    work = Path(args.workdir)
    shapes = json.loads((work / "shapes.json").read_text())
    out = work / f"peer{args.index}.jsonl"
    dht = DHT(start=True, initial_peers=[args.initial_peer] if args.initial_peer else None,
              client_mode=args.client_mode, host_maddrs=["/ip4/0.0.0.0/tcp/0"], startup_timeout=60)
    try:
        if args.index == 0:
            maddrs = [str(m) for m in dht.get_visible_maddrs() if str(m).startswith(LAB_ADDRESS_PREFIX)]
            (work / "maddr.tmp").write_text(maddrs[0])
            (work / "maddr.tmp").rename(work / "maddr")
        parameters = [torch.zeros(shape, requires_grad=True) for shape in shapes]
        for parameter, gradient in zip(parameters, gradients(shapes, args.index)):
            parameter.grad = gradient
        mean = _mean_load(work)
        mm = args.matchmaking_time
        averager_class = GradientAverager if args.hivemind_averager else FlooredGradientAverager
        averager = averager_class(
            parameters, dht=dht, prefix="bench_grad_averager", min_matchmaking_time=mm,
            allreduce_timeout=args.averaging_timeout, client_mode=args.client_mode, auxiliary=args.auxiliary,
            start=True, warn=False,
            compression=compression_build(args.compression),
            bandwidth=args.bandwidth, target_group_size=16, request_timeout=min(3.0, mm / 2))
        (work / f"ready{args.index}").touch()
        while not (work / "go").exists():
            time.sleep(0.05)
        for round_number in range(args.total_rounds):
            if not args.auxiliary:
                averager.accumulate_grads_(batch_size=1)
            control = averager.schedule_step(scheduled_time=get_dht_time() + mm, timeout=args.averaging_timeout)
            while control.stage in (AveragingStage.IDLE, AveragingStage.LOOKING_FOR_GROUP) and not control.done():
                time.sleep(0.002)
            triggered = time.time()
            averager.step(control=control, wait=False)
            while control.stage == AveragingStage.AWAITING_TRIGGER and not control.done():
                time.sleep(0.002)
            started = time.time()
            try:
                gathered = control.result(args.averaging_timeout)
            except Exception as error:  # a failed round is recorded, not fatal
                gathered, problem = None, repr(error)
            else:
                problem = ""
            ended = time.time()
            error = None
            if mean is not None and gathered and not args.auxiliary:
                with averager.get_tensors() as averaged:
                    error = float((torch.cat([tensor.flatten() for tensor in averaged]) - mean).abs().max())
            record = dict(round=round_number, triggered=triggered, started=started, ended=ended,
                          group=len(gathered) if gathered else 0, problem=problem, error=error)
            with out.open("a") as file:
                file.write(json.dumps(record) + "\n")
            _barrier(work, round_number, args.index, args.averaging_timeout, args.n_peers)
        averager.shutdown()
    finally:
        dht.shutdown()


# ---------------------------------------------------------------- coordinator

def _shapes(preset: str) -> list[list[int]]:
    from peer_agent.model import model_build
    from peer_agent.protocol import config_from_preset

    config = config_from_preset(preset)
    model = model_build(config, config.tokenizer.vocab_size)
    return [list(parameter.shape) for parameter in model.parameters() if parameter.requires_grad]


def _fractions(elements: int, bandwidths: list[float], floored: bool = False) -> list[float]:
    """Each peer's share of the vector: hivemind's partition, with the agent's floor if ``floored``
    (hivemind's LP is the same with auxiliaries: it does not model that they send nothing)."""
    from hivemind.averaging.load_balancing import load_balance_peers

    from peer_agent.averaging import shares_with_floor

    parts = load_balance_peers(elements, bandwidths)
    if floored:
        parts = shares_with_floor(parts, [bandwidth > 0 for bandwidth in bandwidths])
    return [part / elements for part in parts]


def round_time_model(size_bytes: float, rates_mbps: list[float], fractions: list[float],
                     auxiliary: list[bool] | None = None) -> float:
    """Seconds a butterfly all-reduce with these shares takes if each host's link runs at its rate:
    host i sends S(1 - f_i) as a sender plus f_i S to each other sender as an aggregator (and receives
    as much); an auxiliary host is no sender. Without auxiliaries that is S(1 + (n - 2) f_i)."""
    auxiliary = auxiliary or [False] * len(rates_mbps)
    senders = sum(not aux for aux in auxiliary)
    return max(size_bytes * ((0 if aux else 1 - f) + f * (senders - (not aux))) * 8 / (rate * 1e6)
               for rate, f, aux in zip(rates_mbps, fractions, auxiliary))


def _hosts(args, case: str, n: int) -> tuple[list[float], list[bool], list[bool]]:
    """The case's hosts: their rates, which are firewalled (client mode) and which are auxiliary."""
    if case in ("hybrid", "volunteers"):
        volunteers = [args.volunteer_rate] * args.volunteers
        if case == "volunteers":
            return volunteers, [False] * len(volunteers), [False] * len(volunteers)
        return [*volunteers, args.aux_rate], [False] * (len(volunteers) + 1), [False] * len(volunteers) + [True]
    rates = [args.fast_rate] * n
    if case == "slow":
        rates[-1] = args.slow_rate
    return rates, [case == "client" and i == n - 1 for i in range(n)], [False] * n


def _declared(args, case: str, mode: str, rates: list[float]) -> list[float]:
    if mode == "equal":
        return [rates[0]] * len(rates)
    if case == "slow" and args.slow_declares is not None:
        return [*rates[:-1], args.slow_declares]
    return list(rates)


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def _kill(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        if process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 10
    for process in processes:
        try:
            process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for process in processes:  # whatever ignored SIGTERM (p2pd, hivemind's children) in the group
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _wait_for(path: Path, processes: list[subprocess.Popen], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if any(process.poll() is not None for process in processes):
            raise RuntimeError(f"a peer exited before {path.name} appeared")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path.name} did not appear within {timeout:.0f} s")
        time.sleep(0.1)


def run_configuration(args, work: Path, lab: NetLab, *, case: str, mode: str, rates: list[float],
                      clients: list[bool], auxiliary: list[bool], total_rounds: int) -> list[dict]:
    """Start the peers for one configuration, let them average, and return per-round records."""
    for stale in work.glob("*"):
        if stale.name not in ("shapes.json", "tcp.json", "links.json", "mean.npy"):
            stale.unlink()
    n = len(rates)
    declared = _declared(args, case, mode, rates)
    processes: list[subprocess.Popen] = []
    log = (work / "peers.log").open("w")

    def start(i: int, initial_peer: str | None) -> None:
        command = lab.command(i, sys.executable, "-m", "bench.averaging", "--role", "peer",
                              "--index", str(i), "--workdir", str(work), "--bandwidth", str(declared[i]),
                              "--compression", args.compression, "--matchmaking-time", str(args.matchmaking_time),
                              "--averaging-timeout", str(args.averaging_timeout), "--total-rounds", str(total_rounds),
                              "--n-peers", str(n))
        if initial_peer:
            command += ["--initial-peer", initial_peer]
        if clients[i]:
            command.append("--client-mode")
        if auxiliary[i]:
            command.append("--auxiliary")
        if mode == "hivemind":
            command.append("--hivemind-averager")
        if mode == "tcp":
            command.append("--tcp")
        if mode in ("ring", "server"):
            command += ["--tcp-strategy", mode]
        processes.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

    try:
        start(0, None)
        if mode not in TCP_MODES:  # these peers need no DHT: they know the hosts' addresses
            _wait_for(work / "maddr", processes, 180)
        bootstrap = (work / "maddr").read_text() if mode not in TCP_MODES else None
        for i in range(1, n):
            start(i, bootstrap)
        for i in range(n):
            _wait_for(work / f"ready{i}", processes, 240)
        (work / "go").touch()
        round_limit = args.averaging_timeout + args.matchmaking_time * 4
        for process in processes:
            process.wait(timeout=total_rounds * round_limit + 60)
    finally:
        _kill(processes)
        log.close()
    per_peer = []
    for i in range(n):
        path = work / f"peer{i}.jsonl"
        per_peer.append([json.loads(line) for line in path.read_text().splitlines()] if path.exists() else [])
    rounds = []
    for records in zip(*per_peer):
        complete = all(record["group"] == n for record in records)
        errors = [r["error"] for r in records if r.get("error") is not None]
        rounds.append(dict(seconds=max(r["ended"] for r in records) - min(r["started"] for r in records),
                           complete=complete, error=max(errors) if errors else None,
                           skew=max(r["started"] for r in records) - min(r["started"] for r in records)))
    if len(rounds) < total_rounds:
        print(f"  ! only {len(rounds)} of {total_rounds} rounds recorded by every peer; tail of peers.log:")
        print("    " + "\n    ".join((work / "peers.log").read_text().splitlines()[-15:]))
    return rounds


def coordinator_main(args: argparse.Namespace) -> None:
    if os.geteuid() != 0:
        sys.exit("needs root: the test hosts are network namespaces")
    # Ctrl-C, and a kill, still run the clean-up below (peers' process groups, the namespaces); a
    # shell that starts us in the background would otherwise leave SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    bytes_per_element = 2 if args.compression == "fp16" else 4
    rows = []
    print(f"uptime before: {_uptime()}")
    with tempfile.TemporaryDirectory(prefix="bench-averaging-") as directory:
        work = Path(directory)
        os.chmod(work, 0o755)
        for preset in args.presets.split(","):
            shapes = _shapes(preset)
            (work / "shapes.json").write_text(json.dumps(shapes))
            elements = sum(_numel(shape) for shape in shapes)
            size = elements * bytes_per_element
            timed = args.large_rounds if preset == "large" and args.large_rounds else args.rounds
            print(f"\n{preset}: {elements:,} elements, S = {size / 1e6:.2f} MB on the wire ({args.compression}); "
                  f"{args.warmup} warm-up + {timed} timed rounds")
            for case in args.cases.split(","):
                sizes = [int(n) for n in args.peers.split(",")] if case in ("homogeneous", "slow", "client") else [0]
                for n in sizes:
                    rows += _run_case(args, work, preset=preset, case=case, n=n, elements=elements, size=size,
                                      timed=timed)
    print(f"\nuptime after: {_uptime()}")
    _print_summary(rows)


def _run_case(args, work: Path, *, preset: str, case: str, n: int, elements: int, size: int, timed: int) -> list[dict]:
    """Every mode of one case on its own lab of hosts; a row per mode."""
    rates, clients, auxiliary = _hosts(args, case, n)
    lp_rates = [0.0 if client else rate for client, rate in zip(clients, rates)]
    bound = round_time_model(size, rates, _fractions(elements, lp_rates), auxiliary)
    rows = []
    # The hosts of this case; leaving the block, however, removes them.
    with NetLab(len(rates), rates, prefix=args.lab_prefix) as lab:
        for mode in args.modes.split(","):
            declared = _declared(args, case, mode, rates)
            shares = _fractions(elements, [0.0 if lp == 0 else d for lp, d in zip(lp_rates, declared)],
                                floored=mode != "hivemind")
            model = round_time_model(size, rates, shares, auxiliary)
            (work / "tcp.json").write_text(json.dumps([shares, size, auxiliary]))
            before = _uptime()
            rounds = run_configuration(args, work, lab, case=case, mode=mode, rates=rates, clients=clients,
                                       auxiliary=auxiliary, total_rounds=args.warmup + timed)
            timed_rounds = [r for r in rounds[args.warmup:] if r["complete"]]
            row = dict(preset=preset, case=case, n=len(rates), mode=mode, rates=rates, shares=shares, model=model,
                       bound=bound, seconds=[r["seconds"] for r in timed_rounds],
                       incomplete=len(rounds[args.warmup:]) - len(timed_rounds),
                       skew=max((r["skew"] for r in timed_rounds), default=0.0),
                       load_before=before, load_after=_uptime())
            rows.append(row)
            _print_row(row)
    return rows


def _numel(shape: list[int]) -> int:
    count = 1
    for dimension in shape:
        count *= dimension
    return count


def _print_row(row: dict) -> None:
    seconds = row["seconds"]
    if not seconds:
        print(f"  {row['case']:<12} n={row['n']} {row['mode']:<9} no complete round")
        return
    mean, median = statistics.mean(seconds), statistics.median(seconds)
    shares = "/".join(f"{share:.2f}" for share in row["shares"])
    print(f"  {row['case']:<12} n={row['n']} {row['mode']:<9} shares {shares}  rounds {len(seconds)} "
          f"(+{row['incomplete']} incomplete)  mean {mean:6.2f} s  median {median:6.2f} s  "
          f"[{min(seconds):.2f}-{max(seconds):.2f}]  model {row['model']:6.2f} s  bound {row['bound']:6.2f} s  "
          f"bound/median {row['bound'] / median:5.1%}  start skew {row['skew']:.2f} s  "
          f"load {row['load_before'].split('average:')[1].split(',')[0].strip()}"
          f"->{row['load_after'].split('average:')[1].split(',')[0].strip()}")


def _print_summary(rows: list[dict]) -> None:
    print("\npreset  case        n  mode       median s   mean s   model s   bound s   of bound   "
          "speedup over equal / tcp's time")
    by_key = {(row["preset"], row["case"], row["n"], row["mode"]): row for row in rows}
    for row in rows:
        if not row["seconds"]:
            continue
        median = statistics.median(row["seconds"])
        speedup = ""
        equal = by_key.get((row["preset"], row["case"], row["n"], "equal"))
        if row["mode"] not in ("equal", "tcp") and equal and equal["seconds"]:
            speedup = f"{statistics.median(equal['seconds']) / median:.2f}x (medians)"
        wire = by_key.get((row["preset"], row["case"], row["n"], "tcp"))
        if row["mode"] == "declared" and wire and wire["seconds"]:
            speedup += f"{' / ' if speedup else ''}tcp {statistics.median(wire['seconds']) / median:.1%} of this time"
        print(f"{row['preset']:<7} {row['case']:<11} {row['n']:2d}  {row['mode']:<9} {median:9.2f} "
              f"{statistics.mean(row['seconds']):8.2f} {row['model']:9.2f} {row['bound']:9.2f} {row['bound'] / median:9.1%}"
              f"   {speedup}")
    for preset in sorted({row["preset"] for row in rows}):
        hybrid = [row for row in rows if row["preset"] == preset and row["case"] == "hybrid" and row["mode"] == "declared"]
        alone = [row for row in rows if row["preset"] == preset and row["case"] == "volunteers" and row["mode"] == "declared"]
        if hybrid and alone and hybrid[0]["seconds"] and alone[0]["seconds"]:
            ratio = statistics.median(alone[0]["seconds"]) / statistics.median(hybrid[0]["seconds"])
            print(f"{preset}: the volunteers average {ratio:.2f}x faster with the auxiliary peer than without it "
                  f"(medians; DeDLOC's claim C1: 1.9x over naive all-reduce on mixed hardware)")


def main() -> None:
    args = _parse()
    if args.role == "peer":
        if args.tcp_strategy:
            tcp_average_peer_main(args)
        else:
            tcp_peer_main(args) if args.tcp else peer_main(args)
    else:
        coordinator_main(args)


if __name__ == "__main__":
    main()
