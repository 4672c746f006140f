"""bench/validators.py at its smallest: the same honest commitments checked by the coordinator's own thread and
by two real validator worker processes, which pass each other the checks of the sessions they keep (on each
worker's own queue, through the broker in files), every check recorded once and passed, the figures in its
SUMMARY line."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(900)

ROOT = Path(__file__).resolve().parents[2]


def test_the_smallest_run_records_every_check_by_the_coordinator_and_by_two_workers(tmp_path):
    # A portal of its own (SQLite, a broker in files), whatever the suite runs on.
    env = {name: value for name, value in os.environ.items() if name not in {"DATABASE_URL", "REDIS_URL"}}
    bench = subprocess.run([sys.executable, "-m", "bench.validators", "--agents", "2", "--epochs", "2", "--steps", "2",
                            "--epoch-seconds", "1", "--workers", "0", "2", "--drain-timeout", "400",
                            "--var-dir", str(tmp_path / "var")],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=840)
    assert bench.returncode == 0, bench.stdout[-3000:] + bench.stderr[-3000:]
    summary = next(line for line in bench.stdout.splitlines() if line.startswith("SUMMARY "))
    rows = re.findall(r"(\d+) workers (\S+) checks/s ratio (\S+) p95 lag (\S+) s recorded (\d+)/(\d+) not passed (\d+) "
                      r"streams (\d+)", summary)
    assert [row[0] for row in rows] == ["0", "2"], summary
    for _, rate, _, lag, recorded, due, not_passed, streams in rows:
        assert (recorded, due, not_passed) == ("4", "4", "0"), summary  # 2 agents x 2 epochs, all honest
        assert float(rate) > 0 and float(lag) >= 0 and 2 <= int(streams) <= 4, summary
    assert float(rows[0][2]) == 1.0, "the baseline's own ratio"
    recorded_by = [(tmp_path / "var" / "logs" / f"validator-2-{number}.log").read_text(errors="replace").count(
        "spot check of session") for number in range(2)]
    assert sum(recorded_by) == 4, recorded_by
