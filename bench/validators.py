"""Validator lag: spot checks due against checks recorded, by agents and validator workers, in one run.

The demo's portal and run (bench/demo_lab.py: SQLite and Celery's broker in files in a fresh var dir, unless
DATABASE_URL and REDIS_URL are set): its model and corpus. Before any clock starts, ``--agents`` sessions each
commit to ``--steps`` honest steps of one micro-batch per epoch for ``--epochs`` epochs, computed as the agent
computes them (peer_agent.spotcheck's fingerprints, each epoch at a state of its own). Then, for each count in
``--workers``, the same commitments arrive again, one epoch's every ``--epoch-seconds``, and the coordinator's
validator checks them as it does in a run (runs/swarm/spotcheck.py, ``Validator._check``, one commitment after
another in its check thread): with 0 workers it recomputes them itself (the baseline: SPOT_CHECK_WORKERS off),
with N it queues them for N real validator workers (``celery -A portal worker -Q validations --include
runs.swarm.recompute --pool solo``, started fresh for the configuration). Each recomputer has ``--threads``
torch threads.

Printed per configuration: checks due and recorded (and any not passed: every step is honest); checks/s from
the first arrival to the last record, and its ratio to the baseline's, same run; epochs whose checks were all
recorded before the next epoch arrived; lag from a commitment's arrival to its record (p50, p95, max);
seconds from the last arrival to the last record; session streams replayed; the recomputers' CPU seconds per
recorded check (the check thread's, or the workers' after their start-up), which a busy machine does not inflate
as it does wall time: the capacity of W workers on W free cores is W over it. A worker's first check of a session
replays the session's stream from its start (tokenizing a pass over the corpus), as a fresh worker in a run does;
the session's later checks go to that worker (runs/swarm/recompute.py, ``session_worker``), so each stream is
replayed once however many workers there are.

Run ``python -m bench.validators --help`` from the repository root.
"""

from __future__ import annotations

import argparse
import queue
import shutil
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import psutil

from bench.demo_lab import demo_lab, percentile, process_start, seconds, services_stop, uptime

READY_TIMEOUT_S = 300.0  # a validator worker imports torch, Django and the data pipeline before it consumes


@dataclass
class Outcome:
    workers: int
    due: int
    recorded: int
    not_passed: int
    checks_per_second: float
    epochs_kept_up: int
    lag: list[float]  # seconds from arrival to record, one per recorded check
    drain: float  # seconds from the last arrival to the last record
    streams: int = 0  # session streams replayed: one per session and worker that checked it
    cpu_per_check: float = 0.0  # CPU seconds of the recomputers (the check thread, or the workers) per recorded check


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.validators", description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=8, help="sessions committing each epoch")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--steps", type=int, default=4, help="steps each session commits to per epoch (the demo's: 4)")
    parser.add_argument("--micro-batch", type=int, default=32, help="examples per step (the demo's: 32)")
    parser.add_argument("--epoch-seconds", type=float, default=4.0, help="between two epochs' arrivals (the demo's: ~4)")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2],
                        help="validator workers per configuration; 0 is the coordinator's own thread (the baseline)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each recomputer")
    parser.add_argument("--drain-timeout", type=float, default=600.0, help="seconds to wait for the last records")
    parser.add_argument("--var-dir", default=None, help="where the portal keeps its files (default: a fresh temp dir)")
    args = parser.parse_args(argv)
    if 0 not in args.workers:
        parser.error("--workers needs 0: the baseline every ratio is taken against")
    return args


def main(argv: list[str] | None = None) -> None:
    args = _parse(argv)
    lab = demo_lab(var_dir=args.var_dir, prefix="dedloc-validators-", volunteers=min(4, args.agents), port=0)
    import torch
    from django.conf import settings
    from django.utils import timezone

    from accounts.services import token_create
    from peer_agent.data import batches, dataset_stream
    from peer_agent.model import model_build
    from peer_agent.spotcheck import data_seed, parameters_fingerprint, step_fingerprint
    from peer_agent.tokenizer import tokenizer_load
    from runs.models import SessionEpoch, StepCommitment, TrainingSession
    from runs.swarm.recompute import STATES_FOLDER
    from runs.swarm.spotcheck import Validator

    torch.set_num_threads(args.threads)
    run = lab.run
    config = run.configuration
    tokenizer = tokenizer_load(Path(run.tokenizer_file.path))
    files = [data_file.file.path for data_file in run.data_files.all()]
    sessions = []
    for number in range(args.agents):
        volunteer = lab.volunteers[number % len(lab.volunteers)]
        token, _ = token_create(user=volunteer, name=f"bench machine {number}")
        sessions.append(TrainingSession.objects.create(
            run=run, user=volunteer, token=token, peer_public_key=f"ssh-rsa bench{number}", agent_version="bench",
            access_expires_at=timezone.now()))
    print(f"var dir {lab.var_dir}; {args.agents} agents x {args.epochs} epochs x {args.steps} steps of "
          f"{args.micro_batch} examples, an epoch every {args.epoch_seconds:g} s; workers {args.workers}, "
          f"{args.threads} thread(s) each; database {settings.DATABASES['default']['ENGINE'].rsplit('.', 1)[1]}; "
          f"uptime: {uptime()}", flush=True)

    # The agents' work, done once: each epoch's state, and each session's steps at it.
    model = model_build(config, len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                        init_seed=zlib.crc32(run.hivemind_run_id.encode()))
    started = time.perf_counter()
    streams = {session.pk: batches(tokenizer, config, dataset_stream(
        config, data_files=files, seed=data_seed(run.hivemind_run_id, session.pk)), args.micro_batch,
        seed=data_seed(run.hivemind_run_id, session.pk)) for session in sessions}
    states, steps = [], {}  # epoch -> its state; (session, epoch) -> its committed steps
    generator = torch.Generator().manual_seed(0)
    for epoch in range(args.epochs):
        with torch.no_grad():  # the swarm's optimizer step: each epoch's state a little off the last
            for parameter in model.parameters():
                parameter.add_(torch.randn(parameter.shape, generator=generator) * parameter.abs().mean() * 0.01)
        states.append([parameter.detach().clone() for parameter in model.parameters()])
        claimed = parameters_fingerprint(model, run.hivemind_run_id, epoch)
        for session in sessions:
            cursor = epoch * args.steps
            steps[session.pk, epoch] = [
                [cursor + index, args.micro_batch,
                 step_fingerprint(model, [next(streams[session.pk])], run.hivemind_run_id, epoch), claimed]
                for index in range(args.steps)]
    print(f"the agents' steps computed in {time.perf_counter() - started:.1f} s", flush=True)

    outcomes = []
    for workers in args.workers:
        StepCommitment.objects.filter(session__run=run).delete()
        SessionEpoch.objects.filter(session__run=run).delete()
        shutil.rmtree(Path(settings.MEDIA_ROOT) / STATES_FOLDER, ignore_errors=True)
        settings.SPOT_CHECK_WORKERS = workers > 0
        processes = [_worker_start(lab.logs / f"validator-{workers}-{number}.log", number, args.threads)
                     for number in range(workers)]
        try:
            started_cpu = sum(_cpu(process) for process in processes)  # after start-up: the imports are not checks
            outcomes.append(_configuration(
                workers=workers, args=args, run=run, config=config, sessions=sessions, states=states, steps=steps,
                validator=Validator(run_pk=run.pk, run_id=run.hivemind_run_id, slug=run.slug, dht=None,
                                    checkpointer=_Holder(tokenizer))))
            if workers:
                outcomes[-1].cpu_per_check = (sum(_cpu(process) for process in processes) - started_cpu) / max(
                    outcomes[-1].recorded, 1)
        finally:
            services_stop(processes)
        outcomes[-1].streams = _streams(lab.logs, workers, sessions)
        _print(outcomes[-1], baseline=outcomes[0])
    summary = "; ".join(f"{outcome.workers} workers {outcome.checks_per_second:.2f} checks/s ratio "
                        f"{outcome.checks_per_second / outcomes[0].checks_per_second:.2f} p95 lag "
                        f"{seconds(percentile(outcome.lag, 95))} s recorded {outcome.recorded}/{outcome.due} "
                        f"not passed {outcome.not_passed} streams {outcome.streams} cpu/check "
                        f"{outcome.cpu_per_check:.3f}" for outcome in outcomes)
    print(f"SUMMARY {summary}; uptime: {uptime()}", flush=True)


class _Holder:
    """The checkpointer's part the validator reads: the run's tokenizer, ready."""

    ready = True

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer


def _cpu(process) -> float:
    times = psutil.Process(process.pid).cpu_times()
    return times.user + times.system


def _worker_start(log: Path, number: int, threads: int):
    from runs.management.commands.demo import validator_command  # Django is set up by then (demo_lab)

    # INFO: the worker says " ready." once it consumes.
    command = validator_command(name=f"validator{number}", loglevel="INFO")
    process = process_start(command, {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}, log)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while " ready." not in (log.read_text(errors="replace") if log.exists() else ""):
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"validator worker {number} did not start: see {log}")
        time.sleep(0.5)
    return process


def _configuration(*, workers: int, args, run, config, sessions, states, steps, validator) -> Outcome:
    """The commitments arrive on their schedule in a thread of their own; the validator takes them in order."""
    from django.db import connection
    from django.utils import timezone

    from runs.models import StepCommitment

    arrived: queue.Queue = queue.Queue()
    arrivals: list[float] = []  # epoch -> when its commitments arrived (time.time())

    def arrive() -> None:
        try:
            start = time.monotonic()
            for epoch in range(args.epochs):
                time.sleep(max(0.0, start + epoch * args.epoch_seconds - time.monotonic()))
                arrivals.append(time.time())
                for session in sessions:
                    arrived.put(StepCommitment.objects.create(
                        session=session, epoch=epoch, micro_batch_size=args.micro_batch, samples=args.steps * args.micro_batch,
                        shuffle_buffer=config.data.shuffle_buffer, steps=steps[session.pk, epoch], received_at=timezone.now()))
        finally:
            arrived.put(None)
            connection.close()

    thread = threading.Thread(target=arrive, name="arrivals")
    thread.start()
    checking_cpu = time.thread_time()  # this thread's: the recomputation itself with 0 workers
    while (commitment := arrived.get()) is not None:
        validator._check(run, config, commitment, [states[commitment.epoch]])
    checking_cpu = time.thread_time() - checking_cpu
    thread.join()
    deadline = time.monotonic() + args.drain_timeout
    pending = StepCommitment.objects.filter(session__run=run, outcome=StepCommitment.Outcome.PENDING)
    while pending.exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    rows = list(StepCommitment.objects.filter(session__run=run).values_list("epoch", "received_at", "checked_at", "outcome"))
    recorded = [(epoch, received.timestamp(), checked.timestamp(), outcome)
                for epoch, received, checked, outcome in rows if checked is not None]
    last = max((checked for _, _, checked, _ in recorded), default=arrivals[-1])
    kept_up = sum(1 for epoch in range(args.epochs)
                  if all(checked < (arrivals[epoch + 1] if epoch + 1 < args.epochs else last + 1)
                         for each, _, checked, _ in recorded if each == epoch)
                  and sum(each == epoch for each, _, _, _ in recorded) == len(sessions))
    return Outcome(workers=workers, due=len(rows), recorded=len(recorded),
                   not_passed=sum(outcome != StepCommitment.Outcome.PASSED for *_, outcome in recorded),
                   checks_per_second=len(recorded) / max(last - arrivals[0], 1e-9), epochs_kept_up=kept_up,
                   lag=[checked - received for _, received, checked, _ in recorded], drain=last - arrivals[-1],
                   cpu_per_check=checking_cpu / max(len(recorded), 1))


def _streams(logs: Path, workers: int, sessions: list) -> int:
    """How many session streams were replayed: each worker that checked a session replays its stream (the
    coordinator's thread replays each once)."""
    if workers == 0:
        return len(sessions)
    texts = [(logs / f"validator-{workers}-{number}.log").read_text(errors="replace") for number in range(workers)]
    return sum(f"spot check of session {session.pk}," in text for session in sessions for text in texts)


def _print(outcome: Outcome, baseline: Outcome) -> None:
    name = "the coordinator's thread" if outcome.workers == 0 else f"{outcome.workers} validator worker(s)"
    print(f"{name:>26}: {outcome.recorded}/{outcome.due} checks recorded ({outcome.not_passed} not passed), "
          f"{outcome.checks_per_second:.2f} checks/s (x{outcome.checks_per_second / baseline.checks_per_second:.2f}), "
          f"epochs kept up {outcome.epochs_kept_up}, lag p50 {seconds(percentile(outcome.lag, 50))} s "
          f"p95 {seconds(percentile(outcome.lag, 95))} s max {seconds(max(outcome.lag, default=None))} s, "
          f"drained {outcome.drain:.1f} s after the last arrival, {outcome.streams} session streams replayed, "
          f"{outcome.cpu_per_check:.3f} CPU s per check; "
          f"{uptime()}", flush=True)


if __name__ == "__main__":
    main()
