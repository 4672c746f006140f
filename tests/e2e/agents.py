"""Starting real peer agents through the CLI against a test portal."""

import os
import subprocess
import sys
import time
from contextlib import suppress
from pathlib import Path

import psutil

from harness.processes import hivemind_locks_held
from runs.setup import services
from runs.setup.corpus import corpus_lines
from runs.setup.forms import preset_config
from tests.factories import RunFactory

ROOT = Path(__file__).resolve().parents[2]


def small_run(organizer, *, target_batch_size: int = 32):
    """A tiny model's run. At the default target, a lone agent's epoch takes about a second: on a busy
    machine it outruns the monitor's reading, and the validator holds no state served past the reading
    (runs/swarm/spotcheck.py, ``READING_LAG_EPOCHS``); a test that trains one agent alone takes a larger one."""
    config = preset_config("tiny").model_dump(mode="json")
    config["data"].update(max_seq_length=64, shuffle_buffer=200)
    config["tokenizer"]["vocab_size"] = 800
    config["training"].update(target_batch_size=target_batch_size, per_device_batch_size=8)
    config["averaging"].update(matchmaking_time=1.5, averaging_timeout=15.0)
    # A fixed run id: the agents draw the model's initial weights (crc32 of it), and with their session's id
    # their data order (peer_agent.spotcheck.data_seed), from it; so the losses and spot-check distances the
    # tests read start from the same weights on every run. The factory's default id is random.
    run = RunFactory(slug="e2e-run", status="draft", tokenizer_status="missing", organizers=[organizer], config=config,
                     hivemind_run_id="e2e-run-seed-0")
    services.data_file_add(run=run, actor=organizer, name="corpus.txt", content="\n".join(corpus_lines(n_lines=3000)).encode())
    services.tokenizer_train(run_id=run.pk)
    services.run_transition(run=run, actor=organizer, action="activate")
    return run


def agent(server: str, secret: str, home: Path, runtime: str, run: str = "e2e-run",
          module: str = "peer_agent", command_name: str = "join", options: tuple[str, ...] = ()) -> subprocess.Popen:
    """A `peer-agent join` process for ``run`` (or a test's variant of the agent: ``module``; or another
    subcommand: ``command_name``, e.g. "aggregate"), with the command's further ``options``."""
    env = {
        **os.environ, "PEER_AGENT_TOKEN": secret, "PEER_AGENT_HOME": str(home), "PEER_AGENT_THREADS": "1",
        "PEER_AGENT_HOST": "/ip4/127.0.0.1/tcp/0", "PEER_AGENT_CLIENT_MODE": "off", "PEER_AGENT_REPORT_INTERVAL": "2",
    }
    command = [sys.executable, "-m", module, command_name, "--portal", server, run, "--max-runtime", runtime, *options]
    log = open(home.parent / f"{home.name}.log", "ab")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(1)


def serve_until(coordinator, condition, timeout: float, what: str) -> None:
    """Run the coordinator's cycles (heartbeat and monitor poll) in this thread until ``condition``;
    like `serve`, a cycle that fails (SQLite's shared-cache test database locks tables) is retried."""
    from runs.models import RunSample

    deadline = time.monotonic() + timeout
    while not condition():
        series = list(RunSample.objects.order_by("-at").values_list("global_epoch", "alive_peers")[:10])
        assert time.monotonic() < deadline, f"timed out waiting for {what}; the latest samples (epoch, peers): {series}"
        coordinator.cycle()
        time.sleep(1)


def backbone_kill(coordinator) -> None:
    """What SIGKILL to `run_coordinator` does to its backbone peers: their processes die at once and
    nothing withdraws their addresses."""
    for peer in coordinator.peers.values():
        family = [psutil.Process(peer.dht.pid), *psutil.Process(peer.dht.pid).children(recursive=True)]
        with hivemind_locks_held():  # the peers were forked from this process: harness/processes.py says why
            for process in family:
                with suppress(psutil.NoSuchProcess):
                    process.kill()
            psutil.wait_procs(family, timeout=10)
    coordinator.peers.clear()
