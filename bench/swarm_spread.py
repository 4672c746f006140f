"""The agent's swarm tests of learning over many seeds: the spread behind their thresholds (issue #28).

Each scenario is one test's swarm, made as the test makes it (harness/tiny_swarm.py: the tiny ALBERT on
its generated corpus, real hivemind peers on loopback in threads of this process, harness/swarm.py), run
``--runs`` times with other data seeds: run n gives its peers seeds k·n+1 … k·n+k, so run 0 is the test's
own. What is measured is what the test asserts on: how much the loss on fixed batches fell, the worse of
the (honest) peers' (``before - max(after)``).

- ``attack-mean``, ``attack-clip``: tests/peer_agent/test_robust_aggregation.py, two honest peers and one
  that sends its gradients times -100, with the mean and with CenteredClip; the test asserts the fall is
  below 0.05 with the mean and above 0.05 with CenteredClip.
- ``two-peers``: test_training_swarm.py's two peers averaging for 8 epochs; asserted above 0.1.
- ``delayed``: the same with delayed parameter updates; asserted above 0.1.

The initial weights come from the run id (the same for every run, as in the tests); what differs between
runs is the data order and hivemind's timing (who gathers which samples in which epoch, which rounds are
partial). Each run takes 30-60 s of a quiet machine's 2 cores.

Run ``python -m bench.swarm_spread --help`` from the repository root; it prints a SUMMARY line per scenario.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
from pathlib import Path

from harness.processes import children_reap
from harness.swarm import ATTACK_EPOCHS, attack_options, poison, train_measured
from harness.tiny_swarm import corpus_write, tokenizer_train, trainer_make

# name: (peers, epochs, options for every peer, whether the last peer attacks, the test's bound on the fall)
SCENARIOS = {
    "attack-mean": (3, ATTACK_EPOCHS, attack_options("mean"), True, ("<", 0.05)),
    "attack-clip": (3, ATTACK_EPOCHS, attack_options("centered_clip"), True, (">", 0.05)),
    "two-peers": (2, 8, {}, False, (">", 0.1)),
    "delayed": (2, 8, dict(averaging=dict(delay_updates=True)), False, (">", 0.1)),
}


def loss_fall(tokenizer, corpus: Path, scenario: str, run: int) -> float:
    """One run of ``scenario`` with run ``run``'s seeds: the worse honest peer's fall in fixed-batch loss."""
    peers, epochs, options, attacked, _ = SCENARIOS[scenario]
    trainers = []
    try:
        for seed in range(peers * run + 1, peers * run + peers + 1):
            trainers.append(trainer_make(tokenizer, corpus, seed, joins=trainers[0] if trainers else None, **options))
        honest = trainers[:-1] if attacked else trainers
        if attacked:
            poison(trainers[-1])
        before, after, _ = train_measured(trainers, epochs, measured=honest)
        return before - max(after)
    finally:
        for trainer in trainers:
            trainer.shutdown()
        children_reap()


def summary(scenario: str, falls: list[float]) -> str:
    """The spread of ``falls`` against the test's bound: how many runs crossed it, and how many standard
    deviations lie between the mean and the bound (a normal draw crosses 3.1 of them once in a thousand)."""
    side, bound = SCENARIOS[scenario][4]
    crossed = sum(fall >= bound for fall in falls) if side == "<" else sum(fall <= bound for fall in falls)
    mean = statistics.fmean(falls)
    sd = statistics.stdev(falls) if len(falls) > 1 else float("nan")
    margin = (bound - mean) / sd if side == "<" else (mean - bound) / sd
    return (f"SUMMARY {scenario}: {len(falls)} runs, fall min {min(falls):.3f} mean {mean:.3f} sd {sd:.3f} "
            f"max {max(falls):.3f}; the test asserts {side} {bound}: {crossed} crossed, mean {margin:.1f} sd inside")


def main(argv: list[str] | None = None) -> dict[str, list[float]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="runs per scenario (run 0 has the test's seeds)")
    parser.add_argument("--scenarios", nargs="+", choices=sorted(SCENARIOS), default=list(SCENARIOS))
    args = parser.parse_args(argv)
    from hivemind.utils.logging import use_hivemind_log_handler

    use_hivemind_log_handler("nowhere")  # the figures, not hivemind's chatter
    logging.getLogger("hivemind").setLevel(logging.ERROR)

    falls: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        corpus = corpus_write(Path(scratch) / "corpus.txt")
        tokenizer = tokenizer_train(corpus)
        for scenario in args.scenarios:
            falls[scenario] = []
            for run in range(args.runs):
                started = time.monotonic()
                falls[scenario].append(loss_fall(tokenizer, corpus, scenario, run))
                print(f"{scenario:<12} run {run:>3}  fall {falls[scenario][-1]:+.3f}  {time.monotonic() - started:5.1f} s",
                      flush=True)
    for scenario, measured in falls.items():
        print(summary(scenario, measured))
    return falls


if __name__ == "__main__":
    main()
