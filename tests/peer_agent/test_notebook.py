"""The notebook's panel reads what the agent writes (peer_agent/notebook.py), and an agent whose parent is
gone stops as SIGTERM stops it (peer_agent/join.py, parent_watch). The notebook itself runs in a real kernel
in tests/e2e/test_join_notebook.py."""

import io
import logging
import multiprocessing
import subprocess
import sys
import textwrap
import time

from rich.console import Console

from peer_agent.display import DHT_LOGGER, DownloadProgress, ProgressDisplay, ProgressSnapshot, logging_setup
from peer_agent.notebook import Panel

SNAPSHOT = ProgressSnapshot(local_samples_per_second=12.5, global_epoch=7, collaboration_samples_per_second=40.0,
                            session_samples=320, acked_samples=256, num_peers=3, eta_next_epoch_s=4.0,
                            samples_accumulated=96, target_batch_size=256, loss=2.5, confirmed_samples=4096,
                            pending_samples=512)


def test_the_panel_shows_the_progress_and_the_last_refusal_the_agent_wrote_as_json_lines():
    written = io.StringIO()
    console = Console(file=written, force_terminal=False)
    logging_setup(console, log_format="json")
    try:
        with ProgressDisplay(console, log_every_s=0) as display:
            display.update(SNAPSHOT)
        logging.getLogger("peer_agent.join").warning("The portal refused: run <b>paused</b> by its organizer")
    finally:
        logging_setup(Console(file=io.StringIO()), log_format="text")

    panel = Panel(run="bengali", portal="https://portal.example")
    for line in [*written.getvalue().splitlines(), "a line that is not JSON"]:
        panel.read(line + "\n")

    assert panel.progress == SNAPSHOT
    assert panel.problem == "The portal refused: run <b>paused</b> by its organizer"
    shown = dict(panel.rows())
    assert shown["Your samples"].startswith("320 this session, 256 acknowledged by the portal")
    assert shown["Epoch"] == "7 (96/256)" and shown["Loss"] == "2.500"
    assert shown["Credit"].startswith("4096 samples confirmed and 512 waiting")
    assert "(256 acknowledged) │ this machine: 4096 confirmed, 512 pending │" in panel.text(), "the terminal's line"
    assert "<b>" not in panel.html() and "run &lt;b&gt;paused&lt;/b&gt;" in panel.html()
    assert "a line that is not JSON" in panel.html()


def test_a_download_shows_as_one_bar_redrawn_in_place_in_the_panel_and_as_lines_in_a_terminal():
    """Issue 32: progress bars where a volunteer waits (the run's checkpoint, its data files)."""
    written = io.StringIO()
    logging_setup(Console(file=written, force_terminal=False), log_format="json")
    try:
        progress = DownloadProgress("The run's newest checkpoint", every_s=3600)
        for done in range(0, 30_000_001, 1_000_000):
            progress(done, 30_000_000)  # the first and the last are shown; the rest fall within every_s
    finally:
        logging_setup(Console(file=io.StringIO()), log_format="text")

    lines = written.getvalue().splitlines()
    assert len(lines) == 2
    panel = Panel(run="bengali", portal="https://portal.example")
    for line in lines:
        panel.read(line + "\n")
    assert panel.state == "The run's newest checkpoint: ████████████████████ 100% (30.0 of 30.0 MB)"
    assert not panel.lines, "redrawn in place, not a line per update"

    terminal = io.StringIO()
    logging_setup(Console(file=terminal, force_terminal=False, width=200), log_format="text")
    try:
        DownloadProgress("Data file corpus.txt")(12_500_000, 50_000_000)
        DownloadProgress("Data file other.txt")(2_000_000, None)
    finally:
        logging_setup(Console(file=io.StringIO()), log_format="text")
    assert "Data file corpus.txt: █████░░░░░░░░░░░░░░░ 25% (12.5 of 50.0 MB)" in terminal.getvalue()
    assert "Data file other.txt: 2.0 MB so far" in terminal.getvalue()


def request_of_a_gone_process() -> FileNotFoundError:
    """The error hivemind's DHT meets reading a request whose sender has exited, made for real: a process sends
    a connection (its reply channel) and exits before it is read."""
    fork = multiprocessing.get_context("fork")
    reader, writer = fork.Pipe(duplex=False)
    sender = fork.Process(target=writer.send, args=(fork.Pipe()[1],))
    sender.start()
    sender.join()
    assert reader.poll(10)
    try:
        reader.recv()
    except FileNotFoundError as gone:
        return gone
    raise AssertionError("the connection was read although its sender had exited")


def test_a_dht_request_whose_sender_exited_prints_no_traceback_at_a_stop():
    """Every Ctrl-C ended in hivemind's traceback "[Errno 2] No such file or directory": the averagers' processes
    exit with requests in the DHT's pipe, whose reply channel the DHT then fetches from a process that is gone."""
    dht = logging.getLogger(DHT_LOGGER)
    quiet, verbose = io.StringIO(), io.StringIO()
    try:
        logging_setup(Console(file=quiet, force_terminal=False, width=200), log_format="text")
        dht.error("a DHT error of another kind")
        gone = request_of_a_gone_process()
        dht.exception(gone, exc_info=gone)  # as hivemind/dht/dht.py's _run logs it, within its except
        logging_setup(Console(file=verbose, force_terminal=False, width=200), log_format="text", verbose=True)
        gone = request_of_a_gone_process()
        dht.exception(gone, exc_info=gone)
    finally:
        logging_setup(Console(file=io.StringIO()), log_format="text")
    assert "a DHT error of another kind" in quiet.getvalue() and "No such file" not in quiet.getvalue()
    assert "No such file or directory" in verbose.getvalue(), "kept for whoever asked for everything"


def test_an_agent_whose_parent_is_gone_stops_as_sigterm_stops_it(tmp_path):
    """A parent that starts the agent's stand-in and dies at once, as a notebook's kernel killed without notice."""
    marker = tmp_path / "stopped"
    agent = textwrap.dedent(f"""
        import signal, sys, time
        from peer_agent.join import parent_watch
        signal.signal(signal.SIGTERM, lambda *_: (open({str(marker)!r}, "w").close(), sys.exit(0)))
        parent_watch(int(sys.argv[1]), every_s=0.1)
        time.sleep(60)
    """)
    parent = f"import os, subprocess, sys; subprocess.Popen([sys.executable, '-c', {agent!r}, str(os.getpid())])"
    subprocess.run([sys.executable, "-c", parent], check=True, timeout=60)
    deadline = time.monotonic() + 60
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marker.exists(), "the orphaned agent did not stop"
