"""Is a 2-peer hivemind swarm the same optimizer as large-batch training in one process?

DeDLOC's central claim: peers that accumulate gradients until the swarm has gathered a global
batch of B samples, average them and take one LAMB step together train exactly as one process
that accumulates B samples and steps. This benchmark trains the same small ALBERT both ways and
compares the loss on a fixed held-out batch after every global step.

How the comparison is made fair:

* Both peers are real ``Trainer`` objects on loopback, in threads of this process. They draw
  micro-batches from ONE deterministic sequence (:class:`BatchPool`), which writes down which peer
  drew which micro-batch in which of its epochs. Peers race: the swarm steps once hivemind's
  progress tracker has seen at least B samples (or its time estimate says so), and while the
  averaging round is arranged the peers keep computing, so a global step holds about B samples,
  split between the peers unevenly. The single process therefore *replays* the record: global
  step e accumulates exactly the micro-batches the peers drew in epoch e, and nothing else.
* Same weights, optimizer and schedule: the replay starts from peer 0's state (parameters and LAMB
  statistics) on entering the first compared epoch, at that point of ``schedule_build``'s schedule,
  with ``Lamb`` over ``parameter_groups`` as ``optimizer_build`` makes it; fp32, one torch thread,
  and the Trainer's clipping (each micro-batch's gradient clipped to ``max_grad_norm`` before it
  is accumulated). The compared epochs begin once the peers hold the same parameters: in the first
  rounds one peer often steps alone (its tracker has not seen the other yet) and the peers differ
  until parameter averaging pulls them together. Before the start everything comes from the same
  initial weights (the Trainer seeds them from the run id).
* Dropout is switched off on both sides (ALBERT has one dropout layer, p=0.1 in the sentence-order
  head). With it on, every forward pass draws from torch's global generator, which the two peers
  share in an order no replay can reproduce (``--dropout`` measures what that does).
* hivemind averages each peer's *mean* gradient weighted by its sample count, which equals the mean
  over all micro-batches (all hold b samples); the replay takes that mean directly. The floating-point
  sums run in another order, so the curves agree to rounding, not bit for bit; the "reversed order"
  replay sums the same micro-batches backwards to show what rounding alone does.
* Compression: ``--compression none`` (the default) averages gradients and parameters in fp32.
  ``fp16`` runs the swarm as a real run would; the "fp16 gradients" replay rounds the averaged
  gradient to fp16, a partial stand-in (hivemind also rounds the parameters it averages).
* Aggregation: ``--aggregation centered_clip`` runs the swarm with the robust all-reduce of
  peer_agent/aggregation.py; with two peers each part has two senders, which it averages, so the
  swarm should still match the replay.
* Delayed parameter updates (``--delay-updates``): each global step's averaging and LAMB step run in
  the background while the peers compute the next epoch, so a micro-batch drawn before the update
  reached the peer's model was computed one step stale. The pool writes down, for each draw, whether
  it was (an update still running, or finished and not yet copied into the model), and the
  "delayed replay" computes exactly those micro-batches on the parameters from before the previous
  step; "one-step delay" computes every micro-batch so (gradient of step e at the parameters after
  step e - 2), and "reference" none (the non-delayed curve).
* Contrasts: "fixed B" takes exactly B consecutive micro-batches of the same sequence per step
  (literal large-batch training, ignoring how the swarm split its steps); "no averaging" steps on
  peer 0's micro-batches only, which is what a swarm whose peers never average would do.

Run ``python -m bench.equivalence --help`` from the repository root.
"""

from __future__ import annotations

import argparse
import logging
import math
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from bench.workload import Workload, dropout_off, workload_build
from harness.pretraining import loss_evaluate
from harness.processes import children_reap
from harness.swarm import PartialRounds, optimizer_watch, partial_rounds_watch, train_together
from peer_agent.optim import Lamb, parameter_groups, schedule_build
from peer_agent.training import Trainer

Batch = dict[str, torch.Tensor]
# How far apart two peers in step hold their parameters, by state compression. Measured: a few float32
# ulps (up to ~1e-7) without compression; ~4.9e-4 with fp16 (its resolution near |w| = 1). A start-up
# round that one peer took alone leaves them 1e-2..0.2 apart until parameter averaging pulls them together.
PEERS_AGREE = {"none": 1e-6, "fp16": 2e-3}
RESYNCS = 3  # times the second peer may load the first's state to start a comparison again (swarm_train)


@dataclass(frozen=True)
class Draw:
    """Micro-batch ``index`` of the pool went to ``peer`` while that peer was in ``epoch``."""

    index: int
    peer: int
    epoch: int
    stale: bool = False  # drawn while the peer's previous update had not reached its model (delayed updates)


class BatchPool:
    """One deterministic sequence of micro-batches that several peers draw from in turn (thread-safe)."""

    def __init__(self, source: Iterator[Batch]):
        self._source, self._lock = source, threading.Lock()
        self.batches: list[Batch] = []
        self.draws: list[Draw] = []

    def stream(self, peer: int, epoch_of: Callable[[], int],
               stale_of: Callable[[], bool] = lambda: False) -> Iterator[Batch]:
        """The batches ``peer`` gets; ``epoch_of()`` and ``stale_of()`` are asked for its epoch and whether its
        parameters lag its last update at each draw."""
        while True:
            with self._lock:
                index = len(self.batches)
                self.batches.append(next(self._source))
                self.draws.append(Draw(index, peer, epoch_of(), stale_of()))
            yield self.batches[index]

    def extend_to(self, count: int) -> list[Batch]:
        """Every batch drawn so far, after drawing more (to nobody) until there are at least ``count``."""
        with self._lock:
            while len(self.batches) < count:
                self.batches.append(next(self._source))
            return list(self.batches)


@dataclass(frozen=True)
class PeerState:
    """A peer's training state on entering an epoch: the model's parameters and LAMB's statistics
    (in ``parameter_groups`` order)."""

    parameters: list[torch.Tensor]
    optimizer_state: list[dict[str, torch.Tensor]]

    @classmethod
    def of(cls, trainer: Trainer) -> PeerState:
        lamb = trainer.optimizer.state_averager.optimizer  # hivemind's offloaded copy, where LAMB steps
        return cls(parameters=[param.detach().clone() for param in trainer.model.parameters()],
                   optimizer_state=[{key: value.clone() for key, value in lamb.state[param].items()}
                                    for group in lamb.param_groups for param in group["params"]])

    def load_into(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        with torch.no_grad():
            for param, value in zip(model.parameters(), self.parameters, strict=True):
                param.copy_(value)
            params = [param for group in optimizer.param_groups for param in group["params"]]
            for param, state in zip(params, self.optimizer_state, strict=True):
                for key, value in state.items():
                    optimizer.state[param][key].copy_(value)


@dataclass(frozen=True)
class Anomaly:
    """A global step in which ``peer``'s gradients were not averaged with the other peer's."""

    peer: int
    epoch: int
    what: str

    def __str__(self) -> str:
        return f"peer {self.peer} at epoch {self.epoch}: {self.what}"


@dataclass
class SwarmRecord:
    """What a swarm run did: the micro-batches, who drew them when, and each peer's state per epoch."""

    pool: BatchPool
    snapshots: list[dict[int, PeerState]]  # per peer: epoch -> state on entering it
    anomalies: list[Anomaly] = field(default_factory=list)  # rounds hivemind did not average normally
    group_sizes: dict[tuple[int, int], int] = field(default_factory=dict)  # (peer, epoch) -> peers averaged with
    resyncs: list[int] = field(default_factory=list)  # epochs at which the second peer loaded the first's state
    wall_s: float = 0.0

    def epochs_reached(self) -> int:
        """Global steps every peer completed."""
        return min(max(epochs) for epochs in self.snapshots)

    def peer_gap(self, epoch: int) -> float:
        """Largest difference between the two peers' parameters on entering ``epoch`` (NaN if one skipped it)."""
        if epoch not in self.snapshots[0] or epoch not in self.snapshots[1]:
            return math.nan
        pairs = zip(self.snapshots[0][epoch].parameters, self.snapshots[1][epoch].parameters, strict=True)
        return max((a - b).abs().max().item() for a, b in pairs)

    def rough_epochs(self) -> list[int]:
        """Global steps, among those both peers completed, that were not an average of both peers'
        gradients: an anomaly noted, or a group of other than 2 peers."""
        reached = self.epochs_reached()
        return sorted({anomaly.epoch for anomaly in self.anomalies if anomaly.epoch < reached} | {
            epoch for epoch in range(reached) for peer in (0, 1) if self.group_sizes.get((peer, epoch)) != 2})

    def comparable_start(self, settle: int, agree: float) -> int | None:
        """The first epoch from ``settle`` (or the last resync, or after the last rough round) on where
        the peers' parameters are at most ``agree`` apart.

        The replay starts from one peer's state: while the peers still disagree (after a start-up
        round that one of them took alone) the swarm's next steps mix their states, which no single
        process reproduces. A round missed on a loaded machine (a part that did not arrive in time:
        hivemind then steps with what arrived, or downloads the other's state) is no large-batch step
        either, so the comparison starts after it.
        """
        rough = [epoch + 1 for epoch in self.rough_epochs()]
        for epoch in range(max([settle, *self.resyncs, *rough]), self.epochs_reached()):
            if self.peer_gap(epoch) <= agree:
                return epoch
        return None

    def step_batches(self, steps: int, peers: set[int] | None = None) -> list[list[int]]:
        """Pool indices that went into each of the first ``steps`` global steps (from ``peers`` only, if given)."""
        chosen: list[list[int]] = [[] for _ in range(steps)]
        for draw in self.pool.draws:
            if draw.epoch < steps and (peers is None or draw.peer in peers):
                chosen[draw.epoch].append(draw.index)
        return chosen

    def stale_batches(self) -> set[int]:
        """Pool indices drawn while the drawing peer's previous update had not reached its model."""
        return {draw.index for draw in self.pool.draws if draw.stale}


def swarm_train(workload: Workload, *, run_id: str, seed: int, settle: int, steps: int, step_time_s: float,
                dropout: bool = False, deadline_s: float = 600.0) -> SwarmRecord:
    """Train two loopback peers for ``settle`` global steps, then until both completed ``settle + steps``
    (or the deadline passed).

    When the start-up rounds leave the peers apart (on a busy machine both can step alone in the
    first round, before either has found the other), averaging never brings them together again:
    state averaging averages the parameters but not LAMB's statistics, so each keeps stepping its own
    way. After ``settle`` steps the second peer then loads the first's state, as a latecomer does, so
    that the comparison can start from one state both share. A round missed later (a part that did
    not arrive in time on a loaded machine) splits them the same way: when fewer than ``steps`` epochs
    follow the last agreement, the second peer loads the first's state again and both train ``steps``
    more, at most ``RESYNCS`` times (once with delayed updates).
    """
    pool = BatchPool(workload.batch_stream(seed))
    partial_rounds = partial_rounds_watch()  # before the averagers fork
    trainers: list[Trainer] = []
    record = SwarmRecord(pool=pool, snapshots=[{}, {}])
    lags: list[Callable[[], bool]] = []
    lag_of: dict[int, Callable[[], bool]] = {0: lambda: False, 1: lambda: False}  # until its Trainer exists
    started = time.monotonic()
    try:
        for peer in range(2):
            setup = workload.trainer_setup(run_id, seed=seed + peer, joins=trainers[0] if trainers else None)
            lags.append(lambda peer=peer: lag_of[peer]())
            stream = pool.stream(peer, lambda peer=peer: trainers[peer].optimizer.local_epoch, lags[peer])
            trainers.append(Trainer(setup, workload.tokenizer, batch_iterator=stream))
            lag_of[peer] = UpdateLag(trainers[peer])
            if not dropout:
                dropout_off(trainers[peer].model)
            _watch(trainers[peer], peer, record, partial_rounds)
        for peer, trainer in enumerate(trainers):
            record.snapshots[peer][trainer.optimizer.local_epoch] = PeerState.of(trainer)

        def snapshot(peer: int, trainer: Trainer, result) -> None:
            # With delayed updates, the state on entering an epoch is there once the last step reached the model.
            if result.local_epoch not in record.snapshots[peer] and not lag_of[peer]():
                record.snapshots[peer][result.local_epoch] = PeerState.of(trainer)

        deadline = time.monotonic() + deadline_s
        agree = PEERS_AGREE[workload.config.averaging.state_compression]
        train_together(trainers, settle, step_time_s=step_time_s, deadline_s=deadline_s, after_step=snapshot)
        target = settle + steps
        # With delayed updates a peer's last step reaches its model only at its next step, so between
        # steps the peers differ by design: they are compared once, after settling.
        for _ in range(1 if workload.config.averaging.delay_updates else RESYNCS):
            if _parameters_gap(trainers) > agree:
                trainers[1].optimizer.load_state_from_peers()
                record.resyncs.append(max(trainer.optimizer.local_epoch for trainer in trainers))
            train_together(trainers, target, step_time_s=step_time_s, deadline_s=deadline - time.monotonic(),
                           after_step=snapshot)
            start = record.comparable_start(settle, agree)
            if start is not None and record.epochs_reached() - start >= steps or time.monotonic() >= deadline:
                break
            target = (record.epochs_reached() if start is None else start) + steps
    finally:
        for trainer in trainers:
            trainer.shutdown()
        children_reap()
    record.wall_s = time.monotonic() - started
    return record


class UpdateLag:
    """Whether a peer's last global step has not reached its model yet (delayed updates): its LAMB step
    runs in the background, or finished and waits for the next ``Optimizer.step`` to copy it in. Notes
    each background update hivemind 1.1.12's ``TrainingStateAverager.step`` starts with a delayed
    optimizer step, and when that step finishes (it sets ``finished_optimizer_step``, and clears it once
    copied in); wraps them on this one instance, only observing."""

    def __init__(self, trainer: Trainer):
        averager = trainer.optimizer.state_averager
        self._averager, self._update, self._stepping = averager, None, False
        step, lag = averager.step, self

        def noted_step(*args, **kwargs):
            before = set(averager.pending_updates)
            output = step(*args, **kwargs)
            if kwargs.get("optimizer_step") and kwargs.get("delay_optimizer_step"):
                started = set(averager.pending_updates) - before
                lag._update, lag._stepping = next(iter(started), None), bool(started)
            return output

        class NotedEvent(type(averager.finished_optimizer_step)):
            def set(self):
                lag._stepping = False
                super().set()

        event = NotedEvent()
        if averager.finished_optimizer_step.is_set():
            event.set()
        averager.step, averager.finished_optimizer_step = noted_step, event

    def __call__(self) -> bool:
        update = self._update
        running = self._stepping and update is not None and not update.done()
        return running or self._averager.finished_optimizer_step.is_set()


def _parameters_gap(trainers: list[Trainer]) -> float:
    pairs = zip(trainers[0].model.parameters(), trainers[1].model.parameters(), strict=True)
    return max((a.detach() - b.detach()).abs().max().item() for a, b in pairs)


def _watch(trainer: Trainer, peer: int, record: SwarmRecord, partial_rounds: PartialRounds) -> None:
    """Note every global step that did not average this peer's gradients with the other's."""

    def anomaly(what: str, epoch: int) -> None:
        record.anomalies.append(Anomaly(peer, epoch, what))

    def group(peer_ids: list, epoch: int) -> None:
        record.group_sizes[peer, epoch] = len(peer_ids)

    optimizer_watch(trainer, on_anomaly=anomaly, on_group=group, partial_rounds=partial_rounds)


def reference_train(workload: Workload, *, run_id: str, start: PeerState, start_step: int, batches: list[Batch],
                    step_batches: list[list[int]], held_out: Batch, dropout: bool = False, reverse: bool = False,
                    fp16_gradients: bool = False, stale: Callable[[int], bool] = lambda index: False) -> list[float]:
    """Large-batch LAMB in one process, from ``start`` (the state after ``start_step`` global steps): for
    each further step, accumulate the clipped gradients of the micro-batches ``step_batches[i]``
    (indices into ``batches``), average them and step. A micro-batch for which ``stale(index)`` holds
    has its gradient computed on the parameters from before the previous step (delayed updates; at the
    first step, on the start). Returns held-out losses, the start's first."""
    training = workload.config.training
    model = workload.model(run_id)
    lagging = workload.model(run_id)  # the parameters before the last step
    if not dropout:
        dropout_off(model)
        dropout_off(lagging)
    params = list(model.parameters())
    optimizer = Lamb(parameter_groups(model, training.weight_decay), lr=training.learning_rate,
                     weight_decay=training.weight_decay, clamp_value=training.clamp_value, eps=1e-6, debias=True)
    schedule = schedule_build(optimizer, warmup_steps=training.warmup_steps, total_steps=training.total_steps)
    start.load_into(model, optimizer)
    lagging.load_state_dict(model.state_dict())
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)`")
        for _ in range(start_step):  # to the swarm's place in the learning-rate schedule
            schedule.step()
    losses = [loss_evaluate(model, held_out)]
    for indices in step_batches:
        if not indices:  # e.g. peer 0 drew nothing in this epoch: a peer alone would not step
            schedule.step()
            losses.append(losses[-1])
            continue
        sums = [torch.zeros_like(param) for param in params]
        for index in reversed(indices) if reverse else indices:
            on = lagging if stale(index) else model
            on.train()
            on(**batches[index]).loss.backward()
            on_params = list(on.parameters())
            torch.nn.utils.clip_grad_norm_(on_params, training.max_grad_norm)  # per micro-batch, as the Trainer clips
            for total, param in zip(sums, on_params, strict=True):
                total.add_(param.grad)
            on.zero_grad(set_to_none=True)
        lagging.load_state_dict(model.state_dict())
        for total, param in zip(sums, params, strict=True):
            mean = total / len(indices)
            param.grad = mean.half().float() if fp16_gradients else mean
        optimizer.step()
        schedule.step()
        model.zero_grad(set_to_none=True)
        losses.append(loss_evaluate(model, held_out))
    return losses


def swarm_losses(workload: Workload, record: SwarmRecord, *, run_id: str, peer: int, epochs: range,
                 held_out: Batch) -> list[float]:
    """Held-out loss of ``peer``'s parameters on entering each of ``epochs`` (NaN where it skipped one)."""
    model = workload.model(run_id)
    losses = []
    for epoch in epochs:
        saved = record.snapshots[peer].get(epoch)
        if saved is None:
            losses.append(math.nan)
            continue
        with torch.no_grad():
            for param, value in zip(model.parameters(), saved.parameters, strict=True):
                param.copy_(value)
        losses.append(loss_evaluate(model, held_out))
    return losses


@dataclass
class Comparison:
    """Held-out loss curves over global steps ``first_step``.. (index 0: on entering ``first_step``)."""

    curves: dict[str, list[float]]
    first_step: int
    samples_per_step: list[int]
    record: SwarmRecord

    @property
    def compared_epochs(self) -> range:
        return range(self.first_step, self.first_step + len(self.samples_per_step))

    def gap(self, name: str, against: str = "reference") -> tuple[float, float]:
        """Max and mean absolute difference between two curves over the compared steps (NaN if one is missing)."""
        gaps = [abs(a - b) for a, b in zip(self.curves[name][1:], self.curves[against][1:], strict=True)]
        return max(gaps, key=lambda gap: math.inf if math.isnan(gap) else gap), sum(gaps) / len(gaps)


def equivalence_measure(workload: Workload, *, steps: int, settle: int = 2, seed: int = 0, step_time_s: float = 0.25,
                        held_out_size: int = 64, dropout: bool = False, deadline_s: float = 600.0) -> Comparison:
    """Train the swarm for ``settle + steps`` global steps, then the single-process references from the
    swarm's state after ``settle`` steps on the same micro-batches, and compare the next ``steps``."""
    run_id = f"bench_equivalence_{seed}"
    torch.set_num_threads(1)  # what the Trainers use: the same kernels, so the same rounding
    record = swarm_train(workload, run_id=run_id, seed=seed, settle=settle, steps=steps, step_time_s=step_time_s,
                         dropout=dropout, deadline_s=deadline_s)
    start = record.comparable_start(settle, PEERS_AGREE[workload.config.averaging.state_compression])
    end = record.epochs_reached()
    if start is None or start >= end:
        raise RuntimeError(f"the swarm reached epoch {end} and its peers never agreed from epoch {settle} on "
                           "(see the anomalies); try a longer --deadline or more --steps")
    steps = end - start
    held_out = next(workload.batch_stream(seed + 10_000, held_out_size, held_out=True))
    per_step = record.step_batches(end)[start:]
    peer0_only = record.step_batches(end, peers={0})[start:]
    training = workload.config.training
    fixed = training.target_batch_size // training.per_device_batch_size
    first = min(per_step[0], default=0)  # where the compared steps begin in the pool
    batches = record.pool.extend_to(first + fixed * steps)

    def reference(step_batches, **options):
        return reference_train(workload, run_id=run_id, start=record.snapshots[0][start], start_step=start,
                               batches=batches, step_batches=step_batches, held_out=held_out, dropout=dropout, **options)

    epochs = range(start, end + 1)
    curves = {
        "swarm peer 0": swarm_losses(workload, record, run_id=run_id, peer=0, epochs=epochs, held_out=held_out),
        "swarm peer 1": swarm_losses(workload, record, run_id=run_id, peer=1, epochs=epochs, held_out=held_out),
        "reference": reference(per_step),
        "reversed order": reference(per_step, reverse=True),
        "fp16 gradients": reference(per_step, fp16_gradients=True),
        "fixed B": reference([list(range(first + i * fixed, first + (i + 1) * fixed)) for i in range(steps)]),
        "no averaging": reference(peer0_only),
    }
    if workload.config.averaging.delay_updates:
        stale = record.stale_batches()
        curves["delayed replay"] = reference(per_step, stale=stale.__contains__)
        curves["one-step delay"] = reference(per_step, stale=lambda index: True)
    samples = [len(indices) * training.per_device_batch_size for indices in per_step]
    return Comparison(curves=curves, first_step=start, samples_per_step=samples, record=record)


def comparison_print(comparison: Comparison) -> None:
    """The loss table, the gaps to the reference and what the swarm did."""
    names = list(comparison.curves)
    print("step  samples  " + "  ".join(f"{name:>14}" for name in names) + "  |peer 0 - ref|  peers apart")
    for row in range(len(comparison.curves["reference"])):
        samples = comparison.samples_per_step[row - 1] if row else 0
        values = "  ".join(f"{comparison.curves[name][row]:14.6f}" for name in names)
        gap = abs(comparison.curves["swarm peer 0"][row] - comparison.curves["reference"][row])
        apart = comparison.record.peer_gap(comparison.first_step + row)
        print(f"{comparison.first_step + row:4d}  {samples:7d}  {values}  {gap:14.1e}  {apart:11.1e}")
    print(f"\n{'curve':>16}  {'max |gap| to reference':>22}  {'mean |gap|':>10}")
    for name in names:
        if name != "reference":
            worst, mean = comparison.gap(name)
            print(f"{name:>16}  {worst:22.3e}  {mean:10.3e}")
    record = comparison.record
    print(f"\nswarm: {record.wall_s:.1f} s wall; averaging group sizes {sorted(set(record.group_sizes.values()))}; "
          f"rough rounds {record.rough_epochs()}, none among the compared steps")
    for anomaly in record.anomalies:
        print(f"  {anomaly}")


def stale_share(comparison: Comparison) -> float:
    """Of the compared steps' micro-batches, the share computed before the previous update reached the peer."""
    epochs = comparison.compared_epochs
    draws = [draw for draw in comparison.record.pool.draws if draw.epoch in epochs]
    return sum(draw.stale for draw in draws) / max(1, len(draws))


def delayed_summary_line(comparison: Comparison) -> str:
    """One line for a run with delayed updates: the swarm against the replay with its staleness, the
    replay with a full step of delay, and the non-delayed curve."""
    parts = []
    for name in ("delayed replay", "one-step delay", "reference"):
        worst, mean = comparison.gap("swarm peer 0", against=name)
        parts.append(f"vs {name} max {worst:.2e} mean {mean:.2e}")
    delay_effect, _ = comparison.gap("delayed replay")
    return (f"SUMMARY delayed steps {comparison.first_step}..{comparison.first_step + len(comparison.samples_per_step)}: "
            f"swarm {'; '.join(parts)}; stale micro-batches {stale_share(comparison):.0%}; "
            f"delayed replay vs reference max {delay_effect:.2e}; rough rounds {len(comparison.record.rough_epochs())}")


def summary_line(comparison: Comparison) -> str:
    """One line: the swarm's gap to the reference beside the gaps rounding, fp16 and no averaging make."""
    worst, mean = comparison.gap("swarm peer 0")
    order, _ = comparison.gap("reversed order")
    fp16, _ = comparison.gap("fp16 gradients")
    contrast, _ = comparison.gap("no averaging")
    final = comparison.curves["swarm peer 0"][-1] / comparison.curves["reference"][-1]
    return (f"SUMMARY steps {comparison.first_step}..{comparison.first_step + len(comparison.samples_per_step)}: "
            f"swarm vs reference max {worst:.2e} mean {mean:.2e}, final-loss ratio {final:.9f}; "
            f"rounding (reversed order) max {order:.2e}; fp16 gradients max {fp16:.2e}; "
            f"no-averaging contrast max {contrast:.2e}; rough rounds {len(comparison.record.rough_epochs())}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--steps", type=int, default=30, help="global steps compared")
    parser.add_argument("--settle", type=int, default=2,
                        help="global steps the swarm takes before the comparison starts from its state")
    parser.add_argument("--target-batch-size", "-B", type=int, default=64, help="global batch B")
    parser.add_argument("--per-device-batch-size", "-b", type=int, default=8, help="micro-batch b of each peer")
    parser.add_argument("--seed", type=int, default=0, help="data order and (through the run id) initial weights")
    parser.add_argument("--learning-rate", type=float, default=0.1)
    parser.add_argument("--warmup-steps", type=int, default=0)
    parser.add_argument("--compression", choices=["none", "fp16"], default="none",
                        help="gradient and state compression in the swarm's averaging")
    parser.add_argument("--dropout", action="store_true", help="keep the SOP head's dropout (p=0.1) on")
    parser.add_argument("--aggregation", choices=["mean", "centered_clip"], default="mean",
                        help="how the swarm combines each part of the gradient all-reduce (peer_agent/aggregation.py); "
                             "the replay always takes the mean")
    parser.add_argument("--delay-updates", action="store_true",
                        help="run the swarm with delayed parameter updates and add the replays with their staleness")
    parser.add_argument("--step-time", type=float, default=0.25,
                        help="seconds each peer waits before a local step, standing in for compute")
    parser.add_argument("--held-out-size", type=int, default=64)
    parser.add_argument("--matchmaking-time", type=float, default=1.0,
                        help="the run's matchmaking window; hivemind also waits this long for each part of a round "
                             "(next_chunk_timeout), so a loaded machine needs more")
    parser.add_argument("--deadline", type=float, default=900.0, help="seconds before the swarm gives up")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory() as folder:
        workload = workload_build(Path(folder), target_batch_size=args.target_batch_size,
                                  per_device_batch_size=args.per_device_batch_size, learning_rate=args.learning_rate,
                                  warmup_steps=args.warmup_steps, compression=args.compression,
                                  aggregation=args.aggregation, delay_updates=args.delay_updates,
                                  matchmaking_time=args.matchmaking_time)
        comparison = equivalence_measure(workload, steps=args.steps, settle=args.settle, seed=args.seed,
                                         step_time_s=args.step_time, held_out_size=args.held_out_size,
                                         dropout=args.dropout, deadline_s=args.deadline)
    comparison_print(comparison)
    print(summary_line(comparison))
    if args.delay_updates:
        print(delayed_summary_line(comparison))


if __name__ == "__main__":
    main()
