"""The agent's accelerator path (issue 30): each precision the device offers, trained by the real
``Trainer`` and checked as the portal's validator checks it.

For each precision ``peer_agent.model.precision_choose`` grants on ``--device`` (fp32 always; fp16 with
torch's GradScaler and bf16 on CUDA; bf16 on the CPU), one lone ``Trainer`` (a peer alone steps every
epoch, docs/trust.md) trains ``--steps`` local steps of the ``--preset`` model on pre-made batches and
reports:

- samples/s over the steps after ``--warmup`` (the device synchronised before each clock reading);
- steps the GradScaler skipped (an fp16 overflow commits nothing: ``Trainer.step``);
- the distance between the fingerprint the step committed (the first micro-batch's gradient sketch,
  computed on the device at that precision) and the validator's recomputation of the same micro-batch
  at the same parameters in fp32 on the CPU (``peer_agent.spotcheck.step_fingerprint``, what
  runs/swarm/spotcheck.py runs), against the run's ``verification.tolerance``: an honest GPU step must
  recompute within it, or its volunteer fails spot checks.

Without the device asked for it says so and exits 0: the GPU path is then untested on this machine
(docs/benchmarks.md says where it last ran). ``--device cpu`` runs the same code on the CPU.

Run ``python -m bench.gpu --help`` from the repository root.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.workload import workload_build
from harness.processes import children_reap
from peer_agent.commitments import Commitments
from peer_agent.model import precision_choose
from peer_agent.spotcheck import fingerprint_distance, step_fingerprint
from peer_agent.training import Trainer

RUN_ID = "bench_gpu"
POOL_BATCHES = 16  # distinct micro-batches the trainer cycles through


class RecordingCommitments(Commitments):
    """The agent's commitments part, keeping each step's first committed fingerprint for the bench to recheck."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.committed: list[tuple[int, int, str]] = []  # (epoch, cursor, fingerprint) of each step

    def step_commit(self, epoch: int, cursor: int, fingerprints: list[str], parameters: str) -> None:
        self.committed.append((epoch, cursor, fingerprints[0]))
        super().step_commit(epoch, cursor, fingerprints, parameters)


@dataclass(frozen=True)
class PrecisionResult:
    precision: str
    samples_per_second: float
    skipped: int
    distances: list[float]
    tolerance: float

    def row(self) -> str:
        worst = max(self.distances) if self.distances else float("nan")
        median = statistics.median(self.distances) if self.distances else float("nan")
        verdict = "passes" if self.distances and worst <= self.tolerance else "FAILS" if self.distances else "unchecked"
        return (f"{self.precision:<6} {self.samples_per_second:>10.1f} {self.skipped:>8} {median:>12.2e} {worst:>12.2e} "
                f"{self.tolerance:>9.2f}  {verdict}")


def precisions_offered(device: torch.device) -> list[str]:
    """The precisions the agent would train in on ``device`` when the run asks for each, without repeats."""
    return list(dict.fromkeys(precision_choose(device, policy) for policy in ("fp32", "fp16", "bf16")))


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def precision_measure(folder: Path, *, device: torch.device, precision: str, preset: str, seq_length: int,
                      batch_size: int, steps: int, warmup: int, checks: int) -> PrecisionResult:
    """Train ``steps`` local steps alone at ``precision`` and recheck ``checks`` of them on the CPU in fp32."""
    workload = workload_build(folder, model=dict(preset=preset), seq_length=seq_length, target_batch_size=batch_size,
                              per_device_batch_size=batch_size, warmup_steps=0, total_steps=10_000)
    config = workload.config.model_copy(update={"training": workload.config.training.model_copy(
        update={"precision": precision})})
    pool = list(itertools.islice(workload.batch_stream(seed=0), POOL_BATCHES))
    setup = workload.trainer_setup(RUN_ID, seed=0)
    setup.config, setup.device = config, device
    trainer = Trainer(setup, workload.tokenizer, batch_iterator=itertools.cycle(pool),
                      commitments_factory=RecordingCommitments)
    committed = trainer.commitments.committed
    reference = workload.model(RUN_ID)  # the validator's copy: fp32, on the CPU
    checked_every = max(1, steps // max(checks, 1))
    distances, skipped, samples, started = [], 0, 0, None
    try:
        for index in range(steps):
            if index == warmup:
                _synchronize(device)
                started = time.perf_counter()
            recheck = index % checked_every == 0 and len(distances) < checks
            at = [param.detach().to("cpu", torch.float32, copy=True) for param in trainer.model.parameters()] if recheck else None
            before = len(committed)
            result = trainer.step()
            skipped += result.skipped
            if index >= warmup:
                samples += result.samples
            if at is not None and len(committed) > before:
                epoch, cursor, fingerprint = committed[-1]
                with torch.no_grad():
                    for param, value in zip(reference.parameters(), at, strict=True):
                        param.copy_(value)
                recomputed = step_fingerprint(reference, [pool[cursor % POOL_BATCHES]], RUN_ID, epoch)
                distances.append(fingerprint_distance(fingerprint, recomputed))
        _synchronize(device)
        elapsed = time.perf_counter() - started if started is not None else float("nan")
    finally:
        trainer.shutdown()
        children_reap()
    return PrecisionResult(precision=precision, samples_per_second=samples / elapsed if elapsed > 0 else 0.0,
                           skipped=skipped, distances=distances, tolerance=config.verification.tolerance)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help='torch device: "cuda" (default), "cuda:1", "cpu"')
    parser.add_argument("--preset", default="large", help="model preset (large: sahajBERT's ALBERT-large)")
    parser.add_argument("--seq-length", type=int, default=128, help="tokens per example")
    parser.add_argument("--batch-size", type=int, default=16, help="samples per micro-batch (and per step)")
    parser.add_argument("--steps", type=int, default=30, help="local steps per precision")
    parser.add_argument("--warmup", type=int, default=5, help="first steps left out of samples/s")
    parser.add_argument("--checks", type=int, default=5, help="steps rechecked on the CPU per precision")
    args = parser.parse_args(argv)
    if args.warmup >= args.steps:
        parser.error("--warmup must be less than --steps")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"no CUDA device here (torch {torch.__version__}): the GPU path is untested on this machine")
        return 0
    logging.getLogger("hivemind").setLevel(logging.ERROR)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"device {args.device} ({name}), torch {torch.__version__}, preset {args.preset}, "
          f"{args.batch_size} × {args.seq_length} tokens per step, {args.steps} steps ({args.warmup} warm-up)")
    print(f"{'prec.':<6} {'samples/s':>10} {'skipped':>8} {'median dist':>12} {'worst dist':>12} {'tolerance':>9}  check")
    results = []
    for precision in precisions_offered(device):
        with tempfile.TemporaryDirectory(prefix="bench-gpu-") as folder:
            result = precision_measure(Path(folder), device=device, precision=precision, preset=args.preset,
                                       seq_length=args.seq_length, batch_size=args.batch_size, steps=args.steps,
                                       warmup=args.warmup, checks=args.checks)
        results.append(result)
        print(result.row(), flush=True)
    fp32 = next(result for result in results if result.precision == "fp32")
    for result in results:
        if result is not fp32 and fp32.samples_per_second > 0:
            print(f"{result.precision}/fp32 samples/s: {result.samples_per_second / fp32.samples_per_second:.2f}")
    return 0 if all(result.distances and max(result.distances) <= result.tolerance for result in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
