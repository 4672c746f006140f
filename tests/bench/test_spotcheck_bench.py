"""bench/spotcheck.py: its coverage formula agrees with its simulation of cheaters, and its smallest
configuration measures a real model's costs and prints them in its SUMMARY line."""

import itertools
import re

import numpy as np
import pytest
import torch

from bench.spotcheck import catch_probability, coverage_simulate, main
from peer_agent.protocol import VerificationConfig

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def torch_threads():
    """The bench sets torch's thread count: put it back for the tests that follow."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_the_catch_probability_counts_every_choice_of_checked_steps():
    steps = 8
    for faked, checks in itertools.product(range(1, steps + 1), range(1, 5)):
        choices = list(itertools.combinations(range(steps), checks))
        catching = sum(any(step < faked for step in choice) for choice in choices)
        assert catch_probability(faked=faked, steps=steps, checks=checks) == pytest.approx(catching / len(choices))


def test_the_simulated_cheaters_agree_with_the_formula_and_not_with_its_approximation():
    rng = np.random.default_rng(0)
    for fraction, checks in [(0.1, 1), (0.1, 4), (0.5, 2), (0.9, 3)]:
        row = coverage_simulate(fraction=fraction, steps=10, checks=checks, failures=2, trials=4000, rng=rng)
        assert all(abs(z) < 5 for z in row.z_scores), (fraction, checks, row)
    # Drawing k of s without replacement catches more often than 1-(1-f)^k says, and the simulation sees it.
    row = coverage_simulate(fraction=0.1, steps=10, checks=4, failures=2, trials=4000, rng=rng)
    assert row.exact == pytest.approx(0.4) and row.approx == pytest.approx(0.3439)
    standard_error = (row.approx * (1 - row.approx) / row.epochs_checked) ** 0.5
    assert (row.simulated - row.approx) / standard_error > 5


@pytest.mark.usefixtures("torch_threads")
def test_the_smallest_run_prints_costs_and_distances_the_tolerance_separates(capsys):
    main(["--presets", "tiny", "--steps-per-epoch", "8", "--fractions", "0.5", "--checks", "1", "2",
          "--trials", "500", "--tiny-batch", "2", "--seq-length", "32", "--tiny-steps", "2", "--step-sizes", "2", "4"])
    out = capsys.readouterr().out
    sweep = re.findall(r"^ +(\d+) \( *\d+ examples\)  half (\S+)  other data (\S+)$", out, re.M)
    assert [size for size, _, _ in sweep] == ["2", "4"]
    assert all(float(half) > 0 and float(other) > 0 for _, half, other in sweep)
    summary = next(line for line in out.splitlines() if line.startswith("SUMMARY "))
    found = re.search(r"coverage 2 rows max \|z\| (\S+);.*tiny validator/agent k=1 (\S+) overhead (\S+)% "
                      r"honest max (\S+) cheat min (\S+)", summary)
    assert found, summary
    worst_z, ratio, overhead, honest, cheat = map(float, found.groups())
    assert worst_z < 5
    assert 0 < ratio < 1, "checking one step of eight costs less than training the eight"
    assert 0 < overhead < 100
    tolerance = VerificationConfig().tolerance
    assert honest < tolerance < cheat
