"""Samples per second of the agent's training, with and without hivemind, and the cost of reporting.

Measured, each in its own process(es) started fresh, on the same model and pre-made batches:

(a) a plain PyTorch loop: forward/backward and clipping per micro-batch, one LAMB step per B samples
    (the Trainer's arithmetic without hivemind), with 1 torch thread and with 2;
(b) one agent Trainer alone: hivemind.Optimizer with no other peer. A lone peer never averages: it
    accumulates to B and steps locally, but still runs its DHT, p2pd, progress tracker and the
    offloaded optimizer;
(c) two Trainers on loopback, one process each, averaging gradients every B samples: the aggregate
    and each peer's samples/s.

Every process times its steps over the same window after a warm-up, and data preparation is left
out (batches are made before timing and cycled). Reporting: ``Reporter.report()`` is what the agent's
training loop calls (every ``report_interval``, 5 s by default); it appends the report to the
on-disk spool with an fsync, and the websocket is a background thread. It is timed here directly.

Run ``python -m bench.agent_throughput --help`` from the repository root.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import math
import multiprocessing as mp
import os
import queue as queue_module
import statistics
import tempfile
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import psutil
import torch

from bench.workload import Workload, workload_build
from harness.processes import children_reap
from peer_agent.optim import Lamb, parameter_groups, schedule_build
from peer_agent.reporter import Reporter
from peer_agent.training import Trainer

RUN_ID = "bench_throughput"
TINY_MODEL = dict(preset="tiny")
POOL_BATCHES = 64  # distinct micro-batches each process cycles through


@dataclass(frozen=True)
class Window:
    """The timing every process follows: warm up, then count the steps that end within the window."""

    warmup_s: float
    measure_s: float
    threads: int


@dataclass(frozen=True)
class Throughput:
    """One process's count over the window."""

    samples: int
    global_steps: int
    seconds: float
    longest_step_s: float  # the slowest local step in the window: a step that waited on averaging shows here
    cpu_main_s: float  # CPU time of the training process over the window
    cpu_helpers_s: float  # CPU time of its child processes (hivemind's DHT, p2pd, averagers)

    @property
    def samples_per_second(self) -> float:
        return self.samples / self.seconds


def _workload(folder: Path, options: dict) -> Workload:
    return workload_build(folder, model=TINY_MODEL, **options)


def _batches(workload: Workload) -> list[dict]:
    stream = workload.batch_stream(seed=0)
    return [next(stream) for _ in range(POOL_BATCHES)]


def _count(step, window: Window, go: mp.Event) -> Throughput:
    """Call ``step()`` (returning samples, global epoch) from ``go`` until the window closes."""
    go.wait()
    begin = time.monotonic() + window.warmup_s
    end = begin + window.measure_s
    samples, epochs, longest, cpu_begin = 0, [], 0.0, None
    while (started := time.monotonic()) < end:
        if cpu_begin is None and started >= begin:
            cpu_begin = _cpu_seconds()
        done, epoch = step()
        if begin <= (finished := time.monotonic()) <= end:
            samples += done
            epochs.append(epoch)
            longest = max(longest, finished - started)
    cpu_end = _cpu_seconds()
    cpu_begin = cpu_begin or cpu_end
    return Throughput(samples=samples, global_steps=max(epochs) - min(epochs) if epochs else 0,
                      seconds=window.measure_s, longest_step_s=longest, cpu_main_s=cpu_end[0] - cpu_begin[0],
                      cpu_helpers_s=cpu_end[1] - cpu_begin[1])


def _cpu_seconds() -> tuple[float, float]:
    """User + system CPU seconds of this process, and of its descendants now alive."""
    me = psutil.Process()
    helpers = 0.0
    for child in me.children(recursive=True):
        with suppress(psutil.Error):
            helpers += sum(child.cpu_times()[:2])
    return sum(me.cpu_times()[:2]), helpers


def _plain_main(folder: Path, options: dict, window: Window, ready: mp.Queue, go: mp.Event) -> None:
    """(a): the Trainer's arithmetic in a bare loop."""
    workload = _workload(folder, options)
    torch.set_num_threads(window.threads)
    training = workload.config.training
    model = workload.model(RUN_ID).train()
    optimizer = Lamb(parameter_groups(model, training.weight_decay), lr=training.learning_rate,
                     weight_decay=training.weight_decay, clamp_value=training.clamp_value, eps=1e-6, debias=True)
    schedule = schedule_build(optimizer, warmup_steps=training.warmup_steps, total_steps=training.total_steps)
    batches = itertools.cycle(_batches(workload))
    accumulation = training.target_batch_size // training.per_device_batch_size
    grads = [torch.zeros_like(param) for param in model.parameters()]
    state = dict(micro=0, epoch=0)

    def step():
        model(**next(batches)).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), training.max_grad_norm)
        for total, param in zip(grads, model.parameters(), strict=True):
            total.add_(param.grad)
        model.zero_grad(set_to_none=True)
        state["micro"] += 1
        if state["micro"] == accumulation:
            for total, param in zip(grads, model.parameters(), strict=True):
                param.grad = total.div_(accumulation)
            optimizer.step()
            schedule.step()
            model.zero_grad(set_to_none=True)
            grads[:] = [torch.zeros_like(param) for param in model.parameters()]
            state["micro"], state["epoch"] = 0, state["epoch"] + 1
        return training.per_device_batch_size, state["epoch"]

    ready.put(("ready", None))
    ready.put(("result", _count(step, window, go)))


def _peer_main(folder: Path, options: dict, window: Window, initial_peers: list[str], seed: int,
               ready: mp.Queue, go: mp.Event) -> None:
    """(b) and (c): one agent Trainer."""
    mp.set_start_method("fork", force=True)  # a spawned child would hand "spawn" on to hivemind's processes
    logging.getLogger("hivemind").setLevel(logging.ERROR)
    workload = _workload(folder, options)
    setup = workload.trainer_setup(RUN_ID, seed=seed, threads=window.threads)
    setup.initial_peers = initial_peers
    trainer = Trainer(setup, workload.tokenizer, batch_iterator=itertools.cycle(_batches(workload)))
    try:
        ready.put(("ready", [str(addr) for addr in trainer.dht.get_visible_maddrs()]))

        def step():
            result = trainer.step()
            return result.samples, result.global_epoch

        ready.put(("result", _count(step, window, go)))
    finally:
        trainer.shutdown()
        children_reap()


def throughput_measure(folder: Path, options: dict, window: Window, *, peers: int, plain: bool = False) -> list[Throughput]:
    """Start ``peers`` processes (plain loops, or Trainers bootstrapping from the first), release them
    together and collect each one's count."""
    context = mp.get_context("spawn")
    go = context.Event()
    queues, processes, initial_peers = [], [], []
    for index in range(peers):
        queue = context.Queue()
        if plain:
            args = (folder / f"p{index}", options, window, queue, go)
            target = _plain_main
        else:
            args = (folder / f"p{index}", options, window, initial_peers, index + 1, queue, go)
            target = _peer_main
        process = context.Process(target=target, args=args, daemon=False)
        process.start()
        initial_peers = initial_peers or _receive(queue, process, "ready", 300) or []
        queues.append(queue)
        processes.append(process)
    if peers > 1 and not plain:
        time.sleep(3.0)  # let the peers see each other in the DHT before the clock starts
    go.set()
    results = [_receive(queue, process, "result", window.warmup_s + window.measure_s + 600)
               for queue, process in zip(queues, processes, strict=True)]
    for process in processes:
        process.join(timeout=120)
    return results


def _receive(queue: mp.Queue, process: mp.Process, kind: str, timeout_s: float):
    """The next message of ``kind`` from a measuring process; raises if it died or fell silent."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            got, value = queue.get(timeout=1.0)
        except queue_module.Empty:
            if not process.is_alive():
                raise RuntimeError(f"a measuring process exited with code {process.exitcode}") from None
            continue
        if got == kind:
            return value
    raise TimeoutError(f"no {kind!r} from a measuring process within {timeout_s:.0f} s")


@dataclass(frozen=True)
class ReportCost:
    """Seconds per ``Reporter.report()`` call."""

    calls: int
    mean_s: float
    median_s: float
    p99_s: float


def report_cost(folder: Path, calls: int = 500, *, started: bool) -> ReportCost:
    """Time ``Reporter.report()`` into a fresh spool; ``started`` also runs the sending thread, which
    here keeps failing to connect (nothing listens) and backing off, as when the portal is away."""
    reporter = Reporter(folder, "token", session_id=1, report_url="ws://127.0.0.1:9/ws/agent/")
    if started:
        reporter.start()
    durations = []
    try:
        for index in range(calls):
            begin = time.perf_counter()
            reporter.report(samples=64, steps=8, local_epoch=index, loss=6.5, samples_per_second=100.0)
            durations.append(time.perf_counter() - begin)
    finally:
        reporter.close(timeout=0.1)
    durations.sort()
    return ReportCost(calls=calls, mean_s=statistics.fmean(durations), median_s=statistics.median(durations),
                      p99_s=durations[int(0.99 * (calls - 1))])


@dataclass(frozen=True)
class Measurement:
    """One configuration measured once, with the machine's 1-minute load average around it."""

    name: str
    results: list[Throughput]
    load: tuple[float, float]  # before, after

    @property
    def samples_per_second(self) -> float:
        return sum(result.samples_per_second for result in self.results)


CONFIGURATIONS = ("a1", "a2", "b", "c")


def configuration_measure(key: str, folder: Path, options: dict, window: Window) -> Measurement:
    """Measure configuration ``key`` ("a1", "a2", "b" or "c") once."""
    names = {"a1": f"(a) plain loop, {window.threads} thread(s)", "a2": "(a) plain loop, 2 threads",
             "b": "(b) one Trainer alone", "c": "(c) two Trainers"}
    before = os.getloadavg()[0]
    if key.startswith("a"):
        threads = 2 if key == "a2" else window.threads
        results = throughput_measure(folder, options, Window(window.warmup_s, window.measure_s, threads), peers=1,
                                     plain=True)
    else:
        results = throughput_measure(folder, options, window, peers=1 if key == "b" else 2)
    return Measurement(names[key], results, (before, os.getloadavg()[0]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--seq-length", type=int, default=128, help="tokens per example")
    parser.add_argument("--target-batch-size", "-B", type=int, default=256)
    parser.add_argument("--per-device-batch-size", "-b", type=int, default=8)
    parser.add_argument("--matchmaking-time", type=float, default=2.0)
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds before counting starts")
    parser.add_argument("--seconds", type=float, default=40.0, help="seconds counted")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each Trainer process")
    parser.add_argument("--repeats", type=int, default=1, help="rounds over all configurations, interleaved")
    parser.add_argument("--only", default=",".join(CONFIGURATIONS), help="configurations to measure, of a1,a2,b,c")
    parser.add_argument("--report-calls", type=int, default=500)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    options = dict(seq_length=args.seq_length, target_batch_size=args.target_batch_size,
                   per_device_batch_size=args.per_device_batch_size, compression="fp16",
                   matchmaking_time=args.matchmaking_time, averaging_timeout=30.0)
    window = Window(warmup_s=args.warmup, measure_s=args.seconds, threads=args.threads)
    keys = [key for key in args.only.split(",") if key]
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        probe = _workload(folder / "probe", options)
        params = sum(param.numel() for param in probe.model(RUN_ID).parameters())
        print(f"model: ALBERT tiny preset, {params:,} parameters (vocabulary {len(probe.tokenizer)}), "
              f"seq {args.seq_length}, b={args.per_device_batch_size}, B={args.target_batch_size}, matchmaking "
              f"{args.matchmaking_time:g} s, {args.threads} torch thread(s) per Trainer; {os.cpu_count()} CPUs; "
              f"window {args.warmup:g} s warm-up + {args.seconds:g} s counted", flush=True)
        measurements = []
        for repeat in range(args.repeats):
            for key in keys:
                measurements.append(configuration_measure(key, folder / f"{key}-{repeat}", options, window))
                print(_row(measurements[-1]), flush=True)
        costs = [report_cost(folder / f"spool-{started}", args.report_calls, started=started) for started in (False, True)]
    throughput_print(measurements, costs, args.per_device_batch_size)


def _row(measurement: Measurement) -> str:
    each = ", ".join(f"{result.samples_per_second:.1f}" for result in measurement.results)
    steps = "/".join(str(result.global_steps) for result in measurement.results)
    longest = max(result.longest_step_s for result in measurement.results)
    cpu_main = sum(result.cpu_main_s for result in measurement.results)
    cpu_helpers = sum(result.cpu_helpers_s for result in measurement.results)
    return (f"{measurement.name:<30} {measurement.samples_per_second:9.1f} {each:>13} {steps:>7} {longest:8.2f} "
            f"{cpu_main:6.1f} {cpu_helpers:7.1f} {measurement.load[0]:5.2f}->{measurement.load[1]:.2f}")


def throughput_print(measurements: list[Measurement], costs: list[ReportCost], batch_size: int) -> None:
    """The table (one row per measurement), the ratios of the medians, and the reporting cost."""
    print(f"\n{'configuration':<30} {'samples/s':>9} {'per process':>13} {'g.steps':>7} {'longest':>8} "
          f"{'cpu s':>6} {'helpers':>7} {'load 1m':>10}")
    for measurement in measurements:
        print(_row(measurement))
    medians: dict[str, float] = {}  # robust to one measurement disturbed by other load
    for name in dict.fromkeys(measurement.name for measurement in measurements):
        medians[name] = statistics.median(m.samples_per_second for m in measurements if m.name == name)
    print("\nmedians: " + "; ".join(f"{name} {value:.1f}" for name, value in medians.items()))
    plain = next((value for name, value in medians.items() if name.startswith("(a)") and "2 threads" not in name), None)
    plain2 = medians.get("(a) plain loop, 2 threads")
    alone, two = medians.get("(b) one Trainer alone"), medians.get("(c) two Trainers")
    if plain and alone:
        print(f"(b)/(a) one Trainer alone vs the plain loop (hivemind overhead): {alone / plain:.3f}")
    if alone and two:
        print(f"(c)/(b) two Trainers vs one: aggregate {two / alone:.3f}, per peer {two / 2 / alone:.3f}")
    if plain2 and two:
        print(f"(c)/(a, 2 threads) two Trainers vs one plain process using both cores: {two / plain2:.3f}")
    step_s = batch_size / alone if alone else math.nan  # seconds per local step of the lone Trainer, for scale
    for cost, label in zip(costs, ("spool only", "spool + sending thread (no portal)"), strict=True):
        print(f"Reporter.report() {label}: mean {cost.mean_s * 1e3:.3f} ms, median {cost.median_s * 1e3:.3f} ms, "
              f"p99 {cost.p99_s * 1e3:.3f} ms over {cost.calls} calls; "
              f"{cost.mean_s / 5.0 * 100:.4f}% of a 5 s report interval, "
              f"{cost.mean_s / step_s * 100:.3f}% of one local step")


if __name__ == "__main__":
    main()
