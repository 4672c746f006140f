"""Spot checks: how surely they catch a peer that fakes steps, and what they cost (issue #14).

Four measurements, printed in turn (peer_agent/spotcheck.py is what is measured):

1. **Coverage.** A session commits to ``s`` steps in an epoch (``--steps-per-epoch``); a validator
   recomputes ``k`` of them (``verification.checks_per_epoch``) drawn at random after the commitment
   arrived, without replacement. A peer that faked ``m = f·s`` of them is caught in that epoch with
   probability ``1 - C(s-m, k)/C(s, k)`` (exact), about ``1-(1-f)^k`` (drawing with replacement).
   Faking the same fraction every epoch, it is first caught after ``1/p`` epochs on average, and
   suspended after ``F/p`` (``F`` = ``verification.failures_to_suspend``; a negative binomial mean).
   Next to each figure: a Monte Carlo simulation of ``--trials`` such peers (seeded, numpy), epoch
   by epoch until each is suspended, and how many standard errors it lies from the formula.
2. **Validator cost** per epoch and peer, in CPU seconds (``time.process_time``, one torch thread):
   advancing the session's replay (:class:`~peer_agent.spotcheck.BatchReplay`) through the epoch's
   ``s`` steps of micro-batches, plus ``k`` recomputations with
   :func:`~peer_agent.spotcheck.step_fingerprint`; against the agent's own compute for the epoch,
   ``s`` times its measured step (forward + backward + fingerprint).
3. **Agent overhead**: the fingerprint of each step (``Sketcher.fingerprint``) and the sketch of the
   parameters it was computed at (``Sketcher.parameters``), plus the sketch built
   once per epoch and the commitment signed once per epoch (each divided by ``s``), over a step's
   forward and backward without them, on the same model and micro-batches.
4. **Tolerance evidence**: the distance (:func:`~peer_agent.spotcheck.fingerprint_distance`) between
   a step's claimed fingerprint and the validator's recomputation, for honest recomputations (the
   same parameters; parameters rounded to fp16, as the swarm's state compression sends them;
   parameters perturbed by 1e-3 relative, element-wise Gaussian) and for claims a cheater could
   make (a step on another session's data; half of the step's micro-batches; the session's
   previous step's fingerprint replayed; zeros).

Costs and distances are measured for the ``tiny`` and ``large`` presets (``large`` is sahajBERT's
shape: ALBERT-large, 24 layers sharing one set of weights) at their real vocabularies (8,000 and
32,000 tokens; the tokenizer trained on the generated corpus of bench/workload.py uses the first few
hundred ids), fp32 on the CPU, from freshly initialized weights. The large preset runs short:
``--large-steps`` agent steps of 2 micro-batches of 2 examples of 128 tokens by default, so its
step is much smaller than a real run's and the overhead ratio is the pessimistic side. Every
step holds ``--accumulation`` micro-batches (2 by default, so that "half the step" exists).

Run ``python -m bench.spotcheck --help`` from the repository root.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from hivemind.utils.crypto import RSAPrivateKey

from bench.workload import Workload, workload_build
from peer_agent.model import model_build
from peer_agent.protocol import FINGERPRINT_WIDTH, EpochCommitment, StepCommitment, VerificationConfig
from peer_agent.spotcheck import (
    BatchReplay,
    Sketcher,
    commitment_sign,
    data_seed,
    fingerprint_decode,
    fingerprint_distance,
    fingerprint_encode,
    step_fingerprint,
)

Batch = dict[str, torch.Tensor]
RUN_ID = "bench_spotcheck"
EPOCH = 3  # any epoch: it only seeds the sketch
SESSION, OTHER_SESSION = 1, 2
VOCABULARY = {"tiny": 8000, "large": 32000}  # the presets' real vocabularies (peer_agent/protocol.py)
HONEST = ("same parameters", "validator's parameters in fp16", "validator's parameters x(1+1e-3 N(0,1))",
          "agent in bf16 autocast (CPU)")
DISHONEST = ("another session's data", "half the micro-batches", "previous step's fingerprint", "zeros")


# 1. Coverage


def catch_probability(*, faked: int, steps: int, checks: int) -> float:
    """That at least one of ``checks`` steps drawn without replacement from ``steps`` is one of ``faked``."""
    return 1.0 - math.comb(steps - faked, checks) / math.comb(steps, checks)


@dataclass(frozen=True)
class Coverage:
    """One row of the grid: the formula's figures and the simulation's."""

    fraction: float
    faked: int
    steps: int
    checks: int
    failures: int
    trials: int
    epochs_checked: int  # over all simulated cheaters, until each was suspended
    simulated: float  # the share of those epochs in which a check caught the cheater
    first_catch: float  # mean epochs to the first catch
    suspension: float  # mean epochs to the F-th catch
    horizon: int
    unseen: float  # the share of cheaters not caught in their first ``horizon`` epochs

    @property
    def exact(self) -> float:
        """P(caught in an epoch): k steps drawn without replacement."""
        return catch_probability(faked=self.faked, steps=self.steps, checks=self.checks)

    @property
    def approx(self) -> float:
        return 1 - (1 - self.fraction) ** self.checks

    @property
    def unseen_exact(self) -> float:
        return (1 - self.exact) ** self.horizon

    @property
    def z_scores(self) -> tuple[float, float, float, float]:
        """How many standard errors the simulation lies from the formula, for each of its figures; the
        errors are the formula's own (Bernoulli; geometric and negative binomial variances (1-p)/p² per
        catch), so a certain catch (p = 1) needs the simulation exact."""
        p = self.exact
        return (_z(self.simulated - p, p * (1 - p) / self.epochs_checked),
                _z(self.first_catch - 1 / p, (1 - p) / p**2 / self.trials),
                _z(self.suspension - self.failures / p, self.failures * (1 - p) / p**2 / self.trials),
                _z(self.unseen - self.unseen_exact, self.unseen_exact * (1 - self.unseen_exact) / self.trials))


def _z(difference: float, variance: float) -> float:
    if variance <= 0:
        return 0.0 if abs(difference) < 1e-12 else math.inf
    return difference / math.sqrt(variance)


def coverage_simulate(*, fraction: float, steps: int, checks: int, failures: int, trials: int,
                      rng: np.random.Generator, horizon: int = 10) -> Coverage:
    """``trials`` peers that each fake ``round(fraction·steps)`` of their ``steps`` steps in every
    epoch, checked ``checks`` times per epoch, until ``failures`` checks caught them."""
    faked = round(fraction * steps)
    if not 0 < faked <= steps or not 0 < checks <= steps:
        raise ValueError(f"want 0 < f·s <= s and 0 < k <= s (f={fraction}, s={steps}, k={checks})")
    caught_count = np.zeros(trials, dtype=np.int64)
    first = np.zeros(trials)
    suspended = np.zeros(trials)
    active = np.arange(trials)
    epoch = epochs_checked = epochs_caught = 0
    while active.size:
        epoch += 1
        # The k smallest of s uniform draws sit at a uniformly random k-subset of the steps; the
        # faked steps are the first m (which ones does not matter when the validator draws uniformly).
        picks = rng.random((active.size, steps)).argpartition(checks - 1, axis=1)[:, :checks]
        caught = active[(picks < faked).any(axis=1)]
        epochs_checked += active.size
        epochs_caught += caught.size
        caught_count[caught] += 1
        first[caught[caught_count[caught] == 1]] = epoch
        suspended[caught[caught_count[caught] == failures]] = epoch
        active = active[caught_count[active] < failures]
    return Coverage(fraction=fraction, faked=faked, steps=steps, checks=checks, failures=failures, trials=trials,
                    epochs_checked=epochs_checked, simulated=epochs_caught / epochs_checked,
                    first_catch=float(first.mean()), suspension=float(suspended.mean()), horizon=horizon,
                    unseen=float((first > horizon).mean()))


def coverage_print(rows: list[Coverage], trials: int, seed: int) -> None:
    first = rows[0]
    print(f"coverage: s={first.steps} committed steps per epoch, suspended after F={first.failures} failed epochs; "
          f"{trials:,} simulated cheaters per row (seed {seed}); each figure: formula / simulation; "
          f"(z) = simulation - formula, in standard errors")
    print(f"{'f':>5} {'m':>3} {'k':>2}  {'P exact':>8} {'1-(1-f)^k':>9} {'simulated':>9} {'(z)':>6}   "
          f"{'epochs to 1st catch':>21} {'(z)':>6}   {'epochs to suspension':>21} {'(z)':>6}   "
          f"{f'unseen {first.horizon} epochs':>19} {'(z)':>6}")
    for row in rows:
        z_p, z_first, z_suspension, z_unseen = row.z_scores
        print(f"{row.fraction:5.2f} {row.faked:3d} {row.checks:2d}  {row.exact:8.4f} {row.approx:9.4f} "
              f"{row.simulated:9.4f} {z_p:+6.2f}   {1 / row.exact:9.2f} / {row.first_catch:9.2f} {z_first:+6.2f}   "
              f"{row.failures / row.exact:9.2f} / {row.suspension:9.2f} {z_suspension:+6.2f}   "
              f"{row.unseen_exact:8.4f} / {row.unseen:8.4f} {z_unseen:+6.2f}")


# 2-4. Costs and distances on real models


@dataclass
class PresetMeasure:
    """What one preset cost, in CPU seconds, and the distances of honest and dishonest claims."""

    preset: str
    parameters: int
    micro_batch_size: int
    seq_length: int
    accumulation: int
    agent_steps: int
    forward_backward_s: float = 0.0  # per step, the agent's mean
    fingerprint_s: float = 0.0  # per step, Sketcher.fingerprint with the epoch's sketch built
    parameters_s: float = 0.0  # per step, Sketcher.parameters: what the step was computed at
    sketch_build_s: float = 0.0  # once per epoch
    sign_s: float = 0.0  # once per epoch, a commitment of s steps
    replay_start_s: float = 0.0  # a validator's first epoch of a session: the stream opened, s steps drawn
    replay_epoch_s: float = 0.0  # a later epoch: s more steps drawn
    recompute_s: float = 0.0  # one step_fingerprint (its sketch built anew, as step_fingerprint does)
    distances: dict[str, float] = field(default_factory=dict)
    # micro-batches per step -> (distance of half the step, of another session's step of that size)
    step_sizes: dict[int, tuple[float, float]] = field(default_factory=dict)

    def overhead(self, steps: int) -> float:
        """The fingerprint's share of an agent step, the per-epoch costs spread over ``steps`` steps."""
        return (self.fingerprint_s + self.parameters_s + (self.sketch_build_s + self.sign_s) / steps) / self.forward_backward_s

    def agent_epoch_s(self, steps: int) -> float:
        return steps * (self.forward_backward_s + self.fingerprint_s + self.parameters_s) + self.sketch_build_s + self.sign_s

    def validator_epoch_s(self, checks: int) -> float:
        return self.replay_epoch_s + checks * self.recompute_s


def _cpu_timed(work):
    started = time.process_time()
    result = work()
    return result, time.process_time() - started


def _agent_step(model: torch.nn.Module, micro_batches: list[Batch],
                sketcher: Sketcher) -> tuple[str, float, float, float]:
    """A step as ``peer_agent.training.Trainer.step`` computes it (fp32): the parameters' sketch, each
    micro-batch's loss over their count, backward, then the fingerprint before clipping; (fingerprint,
    CPU s of forward and backward, CPU s of the fingerprint, CPU s of the parameters' sketch)."""
    model.train()
    model.zero_grad(set_to_none=True)
    _, parameters_s = _cpu_timed(lambda: sketcher.parameters(model, EPOCH))

    def forward_backward():
        for batch in micro_batches:
            (model(**batch).loss / len(micro_batches)).backward()

    _, compute_s = _cpu_timed(forward_backward)
    fingerprint, fingerprint_s = _cpu_timed(lambda: sketcher.fingerprint(model, EPOCH))
    model.zero_grad(set_to_none=True)
    return fingerprint, compute_s, fingerprint_s, parameters_s


def _model(workload: Workload, preset: str) -> torch.nn.Module:
    vocabulary = max(VOCABULARY[preset], len(workload.tokenizer))
    return model_build(workload.config, vocabulary, pad_token_id=workload.tokenizer.pad_token_id, init_seed=1)


def _copy_with(model: torch.nn.Module, workload: Workload, preset: str, change) -> torch.nn.Module:
    other = _model(workload, preset)
    with torch.no_grad():
        for mine, theirs in zip(other.parameters(), model.parameters(), strict=True):
            mine.copy_(change(theirs))
    return other


def preset_measure(preset: str, folder: Path, *, micro_batch_size: int, seq_length: int, accumulation: int,
                   agent_steps: int, steps_per_epoch: int, seed: int, step_sizes: Sequence[int] = ()) -> PresetMeasure:
    workload = workload_build(folder / preset, model=dict(preset=preset), seq_length=seq_length,
                              per_device_batch_size=micro_batch_size)
    config, tokenizer, files = workload.config, workload.tokenizer, [str(workload.corpus)]
    model = _model(workload, preset)
    measure = PresetMeasure(preset=preset, parameters=sum(p.numel() for p in model.parameters()),
                            micro_batch_size=micro_batch_size, seq_length=seq_length, accumulation=accumulation,
                            agent_steps=max(agent_steps, 2))

    # The agent: its session's stream, one sketch per epoch (built on the first fingerprint), steps.
    session_seed = data_seed(RUN_ID, SESSION)
    drawn = workload.batch_stream(session_seed, micro_batch_size)
    sketcher = Sketcher(RUN_ID)
    _, measure.sketch_build_s = _cpu_timed(lambda: sketcher.fingerprint(model, EPOCH))  # no gradients yet: the build
    fingerprints, steps = [], []
    for _ in range(measure.agent_steps):
        step = [next(drawn) for _ in range(accumulation)]
        fingerprint, compute_s, fingerprint_s, parameters_s = _agent_step(model, step, sketcher)
        measure.forward_backward_s += compute_s / measure.agent_steps
        measure.fingerprint_s += fingerprint_s / measure.agent_steps
        measure.parameters_s += parameters_s / measure.agent_steps
        fingerprints.append(fingerprint)
        steps.append(step)
    commitment = EpochCommitment(
        epoch=EPOCH, micro_batch_size=micro_batch_size, shuffle_buffer=config.data.shuffle_buffer, signature="A",
        steps=[StepCommitment(cursor=accumulation * index, samples=micro_batch_size * accumulation,
                              fingerprint=fingerprints[index % len(fingerprints)]) for index in range(steps_per_epoch)])
    key = RSAPrivateKey()
    _, measure.sign_s = _cpu_timed(lambda: commitment_sign(commitment, run_id=RUN_ID, session_id=SESSION, key=key))

    # The validator: the session's replay through one epoch and the next, and a recomputation of the
    # last step the agent took (the replay's micro-batches must be the agent's).
    replay = BatchReplay(config, tokenizer, seed=session_seed, micro_batch_size=micro_batch_size, data_files=files)
    per_epoch = steps_per_epoch * accumulation
    _, measure.replay_start_s = _cpu_timed(lambda: replay.micro_batches(0, per_epoch))
    _, measure.replay_epoch_s = _cpu_timed(lambda: replay.micro_batches(per_epoch, per_epoch))
    checked_cursor = accumulation * (measure.agent_steps - 1)
    checked = BatchReplay(config, tokenizer, seed=session_seed, micro_batch_size=micro_batch_size,
                          data_files=files).micro_batches(checked_cursor, accumulation)
    if not all(torch.equal(mine[key], theirs[key]) for mine, theirs in zip(checked, steps[-1]) for key in mine):
        raise AssertionError("the replay did not rebuild the agent's micro-batches")
    claimed = fingerprints[-1]
    recomputed, measure.recompute_s = _cpu_timed(lambda: step_fingerprint(model, checked, RUN_ID, EPOCH))

    # Honest differences, then what a cheater could claim: (claimed, recomputed) fingerprints of the checked step.
    generator = torch.Generator().manual_seed(seed)
    rounded = _copy_with(model, workload, preset, lambda p: p.half().float())
    perturbed = _copy_with(model, workload, preset, lambda p: p * (1 + 1e-3 * torch.randn(p.shape, generator=generator)))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        in_bf16 = step_fingerprint(model, checked, RUN_ID, EPOCH)
    other = workload.batch_stream(data_seed(RUN_ID, OTHER_SESSION), micro_batch_size)
    pairs = {
        "same parameters": (claimed, recomputed),
        "validator's parameters in fp16": (claimed, step_fingerprint(rounded, checked, RUN_ID, EPOCH)),
        "validator's parameters x(1+1e-3 N(0,1))": (claimed, step_fingerprint(perturbed, checked, RUN_ID, EPOCH)),
        "agent in bf16 autocast (CPU)": (in_bf16, recomputed),
        "another session's data": (
            step_fingerprint(model, [next(other) for _ in range(accumulation)], RUN_ID, EPOCH), recomputed),
        "previous step's fingerprint": (fingerprints[-2], recomputed),
        "zeros": (fingerprint_encode(torch.zeros(FINGERPRINT_WIDTH)), recomputed),
    }
    if accumulation >= 2:  # with one micro-batch per step there is no half step to pass off
        pairs["half the micro-batches"] = (step_fingerprint(model, checked[:accumulation // 2], RUN_ID, EPOCH), recomputed)
    measure.distances = {name: fingerprint_distance(*pair) for name, pair in pairs.items()}
    if step_sizes:
        own = [next(drawn) for _ in range(max(step_sizes))]
        measure.step_sizes = cheats_by_step_size(model, own, [next(other) for _ in own], step_sizes)
    return measure


def cheats_by_step_size(model: torch.nn.Module, own: list[Batch], other: list[Batch],
                        sizes: Sequence[int]) -> dict[int, tuple[float, float]]:
    """How far half a step, and another session's step, lie from a step of n micro-batches, for each n.

    A cheat's distance is the gradient noise between the two sets of examples over the step's
    gradient: it shrinks as a step holds more examples. The sketch is linear in the gradient, so a
    step's fingerprint is the mean of its micro-batches' sketches, each computed once.
    """
    def sketches(micro_batches):
        return torch.stack([fingerprint_decode(step_fingerprint(model, [batch], RUN_ID, EPOCH)) for batch in micro_batches])

    mine, theirs = sketches(own), sketches(other)
    found = {}
    for size in sizes:
        step = fingerprint_encode(mine[:size].mean(0))
        found[size] = (fingerprint_distance(fingerprint_encode(mine[:max(1, size // 2)].mean(0)), step),
                       fingerprint_distance(fingerprint_encode(theirs[:size].mean(0)), step))
    return found


def preset_print(measure: PresetMeasure, steps: int, checks: list[int]) -> None:
    m = measure
    print(f"\npreset {m.preset}: {m.parameters:,} parameters; a step is {m.accumulation} micro-batches of "
          f"{m.micro_batch_size}x{m.seq_length} tokens; {m.agent_steps} agent steps measured; CPU seconds")
    print(f"  agent, per step:   forward+backward {m.forward_backward_s:.4f}  fingerprint {m.fingerprint_s:.5f}  "
          f"parameters' sketch {m.parameters_s:.5f}")
    print(f"  agent, per epoch:  sketch built {m.sketch_build_s:.4f}  commitment of {steps} steps signed {m.sign_s:.5f}")
    print(f"  agent overhead: (fingerprint + parameters' sketch + (sketch + signature)/{steps}) / forward+backward = "
          f"{100 * m.overhead(steps):.2f}%")
    print(f"  validator: replay of an epoch's {steps} steps {m.replay_epoch_s:.4f} (the session's first epoch, "
          f"stream opened: {m.replay_start_s:.4f}); recompute one step {m.recompute_s:.4f}")
    agent = m.agent_epoch_s(steps)
    print(f"  the same step, validator recompute / agent (forward+backward+fingerprint): "
          f"{m.recompute_s / (m.forward_backward_s + m.fingerprint_s):.3f}")
    for k in checks:
        print(f"  per epoch and peer, k={k}: validator {m.validator_epoch_s(k):.4f} s vs agent {agent:.4f} s: "
              f"ratio {m.validator_epoch_s(k) / agent:.4f}")
    print("  fingerprint distance of the claim from the validator's recomputation:")
    for name, distance in m.distances.items():
        print(f"    {'honest' if name in HONEST else 'cheat':>6}  {name:<40} {distance:.3e}")
    if m.step_sizes:
        print(f"  cheats by step size ({m.micro_batch_size} examples per micro-batch): micro-batches per step, "
              f"distance of half the step, of another session's step")
        for size, (half, other) in m.step_sizes.items():
            print(f"    {size:4d} ({size * m.micro_batch_size:5d} examples)  half {half:.3e}  other data {other:.3e}")


def main(argv: list[str] | None = None) -> None:
    defaults = VerificationConfig()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--steps-per-epoch", "-s", type=int, default=40,
                        help="steps a session commits to per epoch (f·s is rounded to whole steps)")
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.1, 0.5, 0.9], help="fractions f faked")
    parser.add_argument("--checks", type=int, nargs="+", default=[1, 2, 4], help="checks per epoch k")
    parser.add_argument("--failures-to-suspend", type=int, default=defaults.failures_to_suspend)
    parser.add_argument("--horizon", type=int, default=10, help="epochs over which a cheater's escape is counted")
    parser.add_argument("--trials", type=int, default=20_000, help="simulated cheaters per grid row")
    parser.add_argument("--presets", nargs="*", choices=sorted(VOCABULARY), default=["tiny", "large"],
                        help="models whose costs and distances are measured (none: coverage only)")
    parser.add_argument("--accumulation", type=int, default=2, help="micro-batches per step")
    parser.add_argument("--tiny-batch", type=int, default=8, help="examples per micro-batch, tiny preset")
    parser.add_argument("--large-batch", type=int, default=2, help="examples per micro-batch, large preset")
    parser.add_argument("--seq-length", type=int, default=128, help="tokens per example")
    parser.add_argument("--tiny-steps", type=int, default=8, help="agent steps measured, tiny preset (at least 2)")
    parser.add_argument("--large-steps", type=int, default=2, help="agent steps measured, large preset (at least 2)")
    parser.add_argument("--step-sizes", type=int, nargs="*", default=[2, 4, 8, 16, 32],
                        help="tiny preset: micro-batches per step at which the cheats' distances are measured again")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--seed", type=int, default=0, help="simulation and perturbation seed")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    sys.stdout.reconfigure(line_buffering=True)  # figures show as they come, also into a file
    started = time.monotonic()

    rng = np.random.default_rng(args.seed)
    rows = [coverage_simulate(fraction=f, steps=args.steps_per_epoch, checks=k, failures=args.failures_to_suspend,
                              trials=args.trials, rng=rng, horizon=args.horizon)
            for f in args.fractions for k in args.checks]
    coverage_print(rows, args.trials, args.seed)
    worst_z = max(abs(z) for row in rows for z in row.z_scores)
    summary = [f"coverage {len(rows)} rows max |z| {worst_z:.2f}"]
    default = next((row for row in rows if row.checks == defaults.checks_per_epoch), rows[0])
    summary.append(f"P(catch f={default.fraction} k={default.checks}) {default.exact:.4f} "
                   f"sim {default.simulated:.4f} suspension {default.suspension:.1f} epochs")

    with tempfile.TemporaryDirectory() as folder:
        for preset in args.presets:
            batch, steps = (args.tiny_batch, args.tiny_steps) if preset == "tiny" else (args.large_batch, args.large_steps)
            measure = preset_measure(preset, Path(folder), micro_batch_size=batch, seq_length=args.seq_length,
                                     accumulation=args.accumulation, agent_steps=steps,
                                     steps_per_epoch=args.steps_per_epoch, seed=args.seed,
                                     step_sizes=args.step_sizes if preset == "tiny" else [])
            preset_print(measure, args.steps_per_epoch, args.checks)
            honest = max(measure.distances[name] for name in HONEST)
            cheat = min(measure.distances[name] for name in DISHONEST if name in measure.distances)
            k = defaults.checks_per_epoch
            summary.append(f"{preset} validator/agent k={k} "
                           f"{measure.validator_epoch_s(k) / measure.agent_epoch_s(args.steps_per_epoch):.4f} "
                           f"overhead {100 * measure.overhead(args.steps_per_epoch):.2f}% "
                           f"honest max {honest:.2e} cheat min {cheat:.2e}")
    print("SUMMARY " + "; ".join(summary))
    print(f"total wall: {time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    main()
