"""Byzantine peers: does CenteredClip keep one attacker in four from derailing training? (issue #14)

Four real ``Trainer``s on loopback (threads of this process, one torch thread each) train the same
small ALBERT from the same initial weights, each peer on the same data sequence in every run, for
``--epochs`` global steps. Six runs:

* attack ``none``: four honest peers;
* attack ``sign_flip``: peer 3 sends its gradient times ``--flip-factor`` (-100);
* attack ``noise``: peer 3 sends Gaussian noise whose norm is ``--noise-factor`` (10) times its gradient's;

each with the run's ``averaging.aggregation`` set to ``mean`` (hivemind's average) and to
``centered_clip`` (peer_agent/aggregation.py). The attacker computes its gradients honestly and
corrupts what it hands to the all-reduce: its gradient averager's accumulated mean, in place, just
before the round (the tensors hivemind's ``GradientAverager.load_accumulators_into_averager_`` fills).
It otherwise runs the agent's code unchanged, including its share of the all-reduce and the
parameter averaging.

Peer 0 is honest; its parameters on entering each epoch are kept, and after the run the pretraining
loss (masked LM + sentence order, float64, eval mode: ``harness.pretraining.loss_evaluate``) of each is
computed on ``--held-out-batches`` batches of the held-out corpus, which no peer trains on. The
figures: each run's curve, then attacked/clean final loss for each aggregation and
centered_clip-clean/mean-clean.

What is and is not the same between runs: initial weights (the run id), each peer's micro-batch
sequence (its seed) and the held-out batches are identical; how many micro-batches each peer puts
into each global step depends on thread timing, as in any swarm, so two runs with the same settings
differ a little (``--repeat-clean`` runs the clean mean run twice to show how much). In attacked runs
only three peers' gradients are honest, against four in the clean runs.

Every hivemind process (DHT, p2pd, averagers) is reaped after each run, and on Ctrl-C or SIGTERM.

Run ``python -m bench.byzantine --help`` from the repository root.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import torch

from bench.workload import SMALL_MODEL, Workload, workload_build
from harness.pretraining import loss_evaluate
from harness.processes import children_reap
from harness.swarm import optimizer_watch
from peer_agent.training import Trainer

PEERS = 4
ATTACKER = PEERS - 1  # the last to join; peer 0, the first, is the honest peer whose loss is measured
ATTACKS = ("none", "sign_flip", "noise")
AGGREGATIONS = ("mean", "centered_clip")
MODELS = {"small": SMALL_MODEL, "tiny": dict(preset="tiny")}
SEQ_LENGTHS = {"small": 64, "tiny": 128}


@dataclass(frozen=True)
class Attack:
    """What the attacker does to the gradient it sends."""

    kind: str  # one of ATTACKS
    flip_factor: float = -100.0
    noise_factor: float = 10.0
    seed: int = 0

    def install(self, trainer: Trainer) -> None:
        """Make ``trainer`` send a corrupted gradient in every gradient all-reduce from now on.

        Wraps its gradient averager's ``load_accumulators_into_averager_`` (hivemind 1.1.12,
        hivemind/optim/grad_averager.py), which copies the peer's mean gradient into the tensors the
        averager sends, right before each round; the corruption is applied to those tensors.
        """
        if self.kind == "none":
            return
        averager = trainer.optimizer.grad_averager
        load = averager.load_accumulators_into_averager_
        generator = torch.Generator().manual_seed(self.seed)

        @torch.no_grad()
        def corrupted_load():
            load()
            with averager.get_tensors() as sent:
                if self.kind == "sign_flip":
                    for tensor in sent:
                        tensor.mul_(self.flip_factor)
                else:
                    norm = math.sqrt(sum(tensor.float().pow(2).sum().item() for tensor in sent))
                    noise = [torch.randn(tensor.shape, generator=generator) for tensor in sent]
                    noise_norm = math.sqrt(sum(part.pow(2).sum().item() for part in noise))
                    scale = self.noise_factor * norm / max(noise_norm, 1e-12)
                    for tensor, part in zip(sent, noise, strict=True):
                        tensor.copy_(part.mul_(scale))

        averager.load_accumulators_into_averager_ = corrupted_load


@dataclass
class RunRecord:
    """One run: peer 0's parameters on entering each epoch, and what its averaging rounds did."""

    aggregation: str
    attack: str
    snapshots: dict[int, list[torch.Tensor]] = field(default_factory=dict)  # epoch -> peer 0's parameters
    group_sizes: Counter = field(default_factory=Counter)  # peers in peer 0's gradient rounds -> rounds
    rounds_with_attacker: int = 0  # of peer 0's gradient rounds, those whose group held peer 3
    anomalies: Counter = field(default_factory=Counter)  # what else happened to peer 0's global steps
    epochs_reached: int = 0
    wall_s: float = 0.0  # start-up, training and shutdown
    train_s: float = 0.0  # from the peers' first local steps until all reached the last epoch
    losses: dict[int, float] = field(default_factory=dict)  # epoch -> held-out loss

    @property
    def name(self) -> str:
        return f"{self.aggregation}/{self.attack}"

    def final(self, epochs: int) -> tuple[int, float]:
        """(epoch, loss) on entering the first recorded epoch from ``epochs`` on (NaN if none)."""
        later = [epoch for epoch in self.losses if epoch >= epochs]
        if not later:
            return -1, math.nan
        epoch = min(later)
        return epoch, self.losses[epoch]


def with_aggregation(workload: Workload, aggregation: str) -> Workload:
    config = workload.config
    averaging = config.averaging.model_copy(update=dict(aggregation=aggregation))
    return dataclasses.replace(workload, config=config.model_copy(update=dict(averaging=averaging)))


def _snapshot(trainer: Trainer) -> list[torch.Tensor]:
    return [param.detach().clone() for param in trainer.model.parameters()]


def _watch(trainer: Trainer, record: RunRecord, attacker: object) -> None:
    """Count how peer 0's global steps went: the size of each gradient round's group, whether the
    attacker's peer id (``attacker``) was in it, and the steps it took otherwise."""

    def anomaly(what: str, epoch: int) -> None:
        record.anomalies[what] += 1

    def group(peer_ids: list, epoch: int) -> None:
        record.group_sizes[len(peer_ids)] += 1
        record.rounds_with_attacker += attacker in peer_ids

    optimizer_watch(trainer, on_anomaly=anomaly, on_group=group)


def swarm_run(workload: Workload, *, aggregation: str, attack: Attack, epochs: int, seed: int, step_time_s: float,
              deadline_s: float) -> RunRecord:
    """Train four loopback peers until all completed ``epochs`` global steps (or the deadline passed)."""
    workload = with_aggregation(workload, aggregation)
    record = RunRecord(aggregation=aggregation, attack=attack.kind)
    run_id = f"bench_byzantine_{seed}"  # the same initial weights in every run
    trainers: list[Trainer] = []
    stop = threading.Event()
    errors: list[BaseException] = []
    threads: list[threading.Thread] = []
    started = time.monotonic()
    try:
        for peer in range(PEERS):
            setup = workload.trainer_setup(run_id, seed=seed + peer, joins=trainers[0] if trainers else None)
            trainers.append(Trainer(setup, workload.tokenizer))
            # hivemind's averagers set SIGINT to "ignore" in this process when they start: take Ctrl-C back.
            signal.signal(signal.SIGINT, signal.default_int_handler)
        _watch(trainers[0], record, trainers[ATTACKER].dht.peer_id)
        if attack.kind != "none":
            attack.install(trainers[ATTACKER])
        record.snapshots[trainers[0].optimizer.local_epoch] = _snapshot(trainers[0])
        deadline = time.monotonic() + deadline_s

        def run(peer: int, trainer: Trainer) -> None:
            try:
                while (not stop.is_set() and time.monotonic() < deadline
                       and min(t.optimizer.local_epoch for t in trainers) < epochs):
                    time.sleep(step_time_s)  # stands in for compute, so the swarm's progress reads keep up
                    before = trainer.optimizer.local_epoch
                    trainer.step()
                    if peer == 0 and trainer.optimizer.local_epoch != before:
                        record.snapshots[trainer.optimizer.local_epoch] = _snapshot(trainer)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
                errors.append(exc)
                stop.set()

        threads = [threading.Thread(target=run, args=pair, daemon=True) for pair in enumerate(trainers)]
        training_started = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            while thread.is_alive():
                thread.join(timeout=0.5)  # wakes up for Ctrl-C
        record.train_s = time.monotonic() - training_started
        if errors:
            raise errors[0]
    finally:
        stop.set()
        give_up = time.monotonic() + 2 * workload.config.averaging.averaging_timeout
        for thread in threads:  # a peer may be waiting in an averaging round; daemon threads do not hold exit up
            thread.join(timeout=max(0.0, give_up - time.monotonic()))
        record.epochs_reached = min((t.optimizer.local_epoch for t in trainers), default=0)
        for trainer in trainers:
            try:
                trainer.shutdown()
            except Exception as exc:  # noqa: BLE001 - reaping below is what must happen
                logging.warning("shutting down a peer failed: %r", exc)
        children_reap()
    record.wall_s = time.monotonic() - started
    return record


def held_out_batches(workload: Workload, *, count: int, size: int, seed: int) -> list[dict[str, torch.Tensor]]:
    stream = workload.batch_stream(seed + 10_000, size, held_out=True)
    return [next(stream) for _ in range(count)]


def losses_evaluate(workload: Workload, record: RunRecord, held_out: list[dict[str, torch.Tensor]], seed: int) -> None:
    """Peer 0's held-out loss on entering each recorded epoch (the mean over the held-out batches)."""
    model = workload.model(f"bench_byzantine_{seed}")
    for epoch, parameters in sorted(record.snapshots.items()):
        with torch.no_grad():
            for param, value in zip(model.parameters(), parameters, strict=True):
                param.copy_(value)
        record.losses[epoch] = sum(loss_evaluate(model, batch) for batch in held_out) / len(held_out)


def leftover_processes() -> int:
    """Child processes of this one still alive, torch's shared-memory manager excepted (children_reap keeps it)."""
    alive = 0
    for child in psutil.Process().children(recursive=True):
        with suppress(psutil.NoSuchProcess):  # one that ends while we look is not left over
            alive += child.status() != psutil.STATUS_ZOMBIE and child.name() != "torch_shm_manager"
    return alive


def run_print(record: RunRecord) -> None:
    rounds = ", ".join(f"{count}x{size}" for size, count in sorted(record.group_sizes.items())) or "none"
    others = "; ".join(f"{what} {count}x" for what, count in record.anomalies.items()) or "nothing else"
    print(f"run {record.name}: {record.wall_s:.1f} s wall ({record.train_s:.1f} s training), "
          f"{record.epochs_reached} epochs; peer 0's gradient rounds (count x peers): {rounds}, "
          f"{record.rounds_with_attacker} with peer {ATTACKER}; {others}", flush=True)
    curve = "  ".join(f"{epoch}:{loss:.4f}" for epoch, loss in sorted(record.losses.items()))
    print(f"  held-out loss by epoch: {curve}", flush=True)


def table_print(records: list[RunRecord], epochs: int) -> None:
    print("\nheld-out loss of peer 0 on entering each epoch ('-': it skipped that epoch)")
    print("epoch  " + "  ".join(f"{record.name:>24}" for record in records))
    last = max((max(record.losses, default=0) for record in records), default=0)
    for epoch in range(0, min(last, epochs) + 1):
        cells = [f"{record.losses[epoch]:24.4f}" if epoch in record.losses else f"{'-':>24}" for record in records]
        print(f"{epoch:5d}  " + "  ".join(cells))


def ratios_print(records: list[RunRecord], epochs: int) -> None:
    finals, starts = {}, {}
    print("\nfinal held-out loss (peer 0, on entering epoch N or the first recorded after it)")
    for record in records:
        epoch, loss = record.final(epochs)
        starts.setdefault(record.name, record.losses.get(0, math.nan))
        finals.setdefault(record.name, loss)
        print(f"  {record.name:>24}: {loss:.4f} at epoch {epoch} (start {starts[record.name]:.4f})")
    print("\nratios (attacked/clean: final losses; progress kept: the attacked run's fall from the start over the "
          "clean run's)")
    summary = []
    for aggregation in AGGREGATIONS:
        clean = finals.get(f"{aggregation}/none")
        for attack in ATTACKS[1:]:
            name = f"{aggregation}/{attack}"
            if clean is None or name not in finals:
                continue
            ratio = finals[name] / clean
            kept = (starts[name] - finals[name]) / (starts[name] - clean)
            print(f"  {aggregation:>13} {attack:>9}/clean: {ratio:.4f}   progress kept {kept:+.2f}")
            summary.append(f"{aggregation} {attack}/clean {ratio:.4f} (kept {kept:+.2f})")
    if "mean/none" in finals and "centered_clip/none" in finals:
        ratio = finals["centered_clip/none"] / finals["mean/none"]
        print(f"  centered_clip-clean/mean-clean: {ratio:.4f}")
        summary.append(f"centered_clip-clean/mean-clean {ratio:.4f}")
    repeats = [record for record in records if record.name == "mean/none"]
    if len(repeats) > 1:
        ratio = repeats[1].final(epochs)[1] / repeats[0].final(epochs)[1]
        print(f"  mean-clean repeated/mean-clean (run-to-run variation): {ratio:.4f}")
        summary.append(f"mean-clean repeat {ratio:.4f}")
    print("SUMMARY " + "; ".join(summary))


def plan_parse(text: str) -> list[tuple[str, str]]:
    """``mean/none,centered_clip/sign_flip`` -> [(aggregation, attack), ...]."""
    plan = []
    for item in text.split(","):
        aggregation, _, attack = item.strip().partition("/")
        if aggregation not in AGGREGATIONS or attack not in ATTACKS:
            raise argparse.ArgumentTypeError(f"{item!r}: want AGGREGATION/ATTACK with {AGGREGATIONS} and {ATTACKS}")
        plan.append((aggregation, attack))
    return plan


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--epochs", "-N", type=int, default=30, help="global steps each run takes")
    parser.add_argument("--target-batch-size", "-B", type=int, default=128, help="global batch B")
    parser.add_argument("--per-device-batch-size", "-b", type=int, default=8, help="micro-batch b of each peer")
    parser.add_argument("--learning-rate", type=float, default=0.1)
    parser.add_argument("--matchmaking-time", type=float, default=2.0, help="seconds a matchmaking round lasts")
    parser.add_argument("--averaging-timeout", type=float, default=10.0, help="seconds before a round gives up")
    parser.add_argument("--model", choices=sorted(MODELS), default="small",
                        help="small: bench/workload.py's ~57k-parameter ALBERT on 64-token examples; "
                             "tiny: the tiny preset (~1M parameters, 128 tokens)")
    parser.add_argument("--compression", choices=["none", "fp16"], default="none",
                        help="gradient and state compression in the swarm's averaging")
    parser.add_argument("--flip-factor", type=float, default=-100.0, help="sign_flip: the attacker sends gradient x this")
    parser.add_argument("--noise-factor", type=float, default=10.0,
                        help="noise: the attacker sends Gaussian noise of this many times its gradient's norm")
    parser.add_argument("--runs", type=plan_parse, default=",".join(f"{a}/{k}" for k in ATTACKS for a in AGGREGATIONS),
                        help="comma-separated AGGREGATION/ATTACK runs, in order")
    parser.add_argument("--repeat-clean", action="store_true",
                        help="run mean/none a second time at the end, to show run-to-run variation")
    parser.add_argument("--seed", type=int, default=0, help="data order of the peers (seed+peer) and initial weights")
    parser.add_argument("--step-time", type=float, default=0.25,
                        help="seconds each peer waits before a local step, standing in for compute")
    parser.add_argument("--held-out-batches", type=int, default=4, help="held-out batches the loss is averaged over")
    parser.add_argument("--held-out-size", type=int, default=32, help="examples in each held-out batch")
    parser.add_argument("--deadline", type=float, default=300.0, help="seconds before a run gives up")
    parser.add_argument("--verbose", action="store_true", help="show hivemind's warnings (start-up and shutdown noise)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if not args.verbose:
        logging.getLogger("hivemind").setLevel(logging.ERROR)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # runs the finally blocks, which reap
    plan = list(args.runs) + ([("mean", "none")] if args.repeat_clean else [])
    records: list[RunRecord] = []
    started = time.monotonic()
    interrupted = False
    try:
        with tempfile.TemporaryDirectory() as folder:
            workload = workload_build(
                Path(folder), model=MODELS[args.model], seq_length=SEQ_LENGTHS[args.model],
                target_batch_size=args.target_batch_size, per_device_batch_size=args.per_device_batch_size,
                learning_rate=args.learning_rate, warmup_steps=0, compression=args.compression,
                matchmaking_time=args.matchmaking_time, averaging_timeout=args.averaging_timeout)
            parameters = sum(param.numel() for param in workload.model("probe").parameters())
            print(f"model: {args.model} ({parameters:,} parameters, vocabulary {len(workload.tokenizer)}, "
                  f"seq {SEQ_LENGTHS[args.model]}); {PEERS} peers, peer {ATTACKER} attacks; B={args.target_batch_size}, "
                  f"b={args.per_device_batch_size}, lr {args.learning_rate}, {args.epochs} epochs, matchmaking "
                  f"{args.matchmaking_time} s, compression {args.compression}; held-out "
                  f"{args.held_out_batches}x{args.held_out_size} examples", flush=True)
            held_out = held_out_batches(workload, count=args.held_out_batches, size=args.held_out_size, seed=args.seed)
            for aggregation, kind in plan:
                attack = Attack(kind, flip_factor=args.flip_factor, noise_factor=args.noise_factor, seed=args.seed)
                record = swarm_run(workload, aggregation=aggregation, attack=attack, epochs=args.epochs,
                                   seed=args.seed, step_time_s=args.step_time, deadline_s=args.deadline)
                losses_evaluate(workload, record, held_out, args.seed)
                records.append(record)
                run_print(record)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        children_reap()
        print(f"child processes left after reaping: {leftover_processes()}", flush=True)
    if interrupted:
        print(f"interrupted after {len(records)} of {len(plan)} runs", flush=True)
    table_print(records, args.epochs)
    ratios_print(records, args.epochs)
    print(f"total wall: {time.monotonic() - started:.1f} s")
    if interrupted:
        sys.exit(130)


if __name__ == "__main__":
    main()
