"""bench/validators.py at its smallest: the same honest commitments checked by the coordinator's own thread and
by a real validator worker process, every check recorded once and passed, the figures in its SUMMARY line."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(900)

ROOT = Path(__file__).resolve().parents[2]


def test_the_smallest_run_records_every_check_by_the_coordinator_and_by_a_worker(tmp_path):
    # A portal of its own (SQLite, a broker in files), whatever the suite runs on.
    env = {name: value for name, value in os.environ.items() if name not in {"DATABASE_URL", "REDIS_URL"}}
    bench = subprocess.run([sys.executable, "-m", "bench.validators", "--agents", "2", "--epochs", "2", "--steps", "2",
                            "--epoch-seconds", "1", "--workers", "0", "1", "--drain-timeout", "400",
                            "--var-dir", str(tmp_path / "var")],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=840)
    assert bench.returncode == 0, bench.stdout[-3000:] + bench.stderr[-3000:]
    summary = next(line for line in bench.stdout.splitlines() if line.startswith("SUMMARY "))
    rows = re.findall(r"(\d+) workers (\S+) checks/s ratio (\S+) p95 lag (\S+) s recorded (\d+)/(\d+) not passed (\d+)",
                      summary)
    assert [row[0] for row in rows] == ["0", "1"], summary
    for _, rate, _, lag, recorded, due, not_passed in rows:
        assert (recorded, due, not_passed) == ("4", "4", "0"), summary  # 2 agents x 2 epochs, all honest
        assert float(rate) > 0 and float(lag) >= 0
    assert float(rows[0][2]) == 1.0, "the baseline's own ratio"
    assert (tmp_path / "var" / "logs" / "validator-1-0.log").read_text(errors="replace").count("succeeded") >= 4, \
        "the worker recorded them"
