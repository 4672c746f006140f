"""The `peer-agent` command: help, login, settings precedence, status, and the join loop (with a stand-in trainer)."""

import json
import logging
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from peer_agent import cli, join
from peer_agent.exit_status import EXIT_USAGE
from peer_agent.protocol import config_from_preset
from peer_agent.settings import SettingsError, agent_home, credentials_store, settings_resolve
from peer_agent.spool import Spool, spool_files, spool_read
from tests.peer_agent.fakes import TOKEN, ContractServer, ProbeRoutes, report

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def agent_home_dir(tmp_path, monkeypatch):
    """Every test gets its own agent home and no PEER_AGENT_* settings from the caller's environment."""
    for name in list(os.environ):
        if name.startswith("PEER_AGENT_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("PEER_AGENT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def tokenizer_json() -> str:
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "আমি", "বাংলায়", "গান", "গাই"]
    tokenizer = Tokenizer(models.WordLevel({word: i for i, word in enumerate(words)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return tokenizer.to_str()


class FakePortal:
    """The portal's agent API on loopback: me, run summary, join, tokenizer, a data file and, unless
    ``probes`` is False (an older portal), the bandwidth probes."""

    def __init__(self, report_url: str = "ws://127.0.0.1:9/ws/agent/", probes: bool = True):
        self.status, self.report_url, self.joins, self.refused_joins = "active", report_url, [], 0
        self.probes = ProbeRoutes(token=TOKEN) if probes else None
        self.on_refused_join = None
        self.config = config_from_preset("tiny", data={"source": "files", "hub": []}).model_dump(mode="json")
        self.tokenizer = tokenizer_json().encode()
        portal = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, status: int, body: dict | bytes) -> None:
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _authorized(self) -> bool:
                if self.headers.get("Authorization") == f"Bearer {TOKEN}":
                    return True
                self._send(401, {"error": {"code": "invalid_token", "detail": "this agent token is not valid"}})
                return False

            def do_GET(self):
                if portal.probes and portal.probes.answer(self):
                    return
                if self.path == "/api/v1/me" and self._authorized():
                    self._send(200, {"username": "vik", "public_name": "Vik", "visibility": "public", "team": None,
                                     "token_name": "laptop", "token_run": None, "token_expires_at": "2030-01-01T00:00:00Z"})
                elif self.path == "/api/v1/runs/bengali-albert/":
                    self._send(200, {"slug": "bengali-albert", "status": portal.status, "config": portal.config})
                elif self.path == "/api/v1/runs/bengali-albert/tokenizer.json" and self._authorized():
                    self._send(200, portal.tokenizer)
                elif self.path == "/api/v1/data/signed/3.txt":
                    self._send(200, "আমি বাংলায় গান গাই।\n\n".encode() * 50)
                elif not self.path.startswith("/api/v1/me") and not self.path.endswith("tokenizer.json"):
                    self._send(404, {"error": {"code": "not_found", "detail": "no such page"}})

            def do_POST(self):
                if portal.probes and portal.probes.answer(self):
                    return
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if self.path == "/api/v1/runs/bengali-albert/join" and self._authorized():
                    if portal.status != "active":
                        portal.refused_joins += 1
                        self._send(409, {"error": {"code": "run_paused", "detail": "run “bengali-albert” is "
                                                   "paused by its organizer; the agent will retry every 60 s"}})
                        if portal.on_refused_join:
                            portal.on_refused_join()
                        return
                    answer = portal.join_answer(body["peer_public_key"])
                    portal.joins.append(body)
                    self._send(200, answer)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def join_answer(self, peer_public_key: str) -> dict:
        access = {"username": "vik", "peer_public_key": peer_public_key,
                  "expiration_time": "2030-01-31 12:30:00.000000", "signature": "c2lnbmF0dXJl"}
        return {"session_id": 100 + len(self.joins), "run_id": "bengali-albert", "config": self.config,
                "hivemind_access": access, "authority_public_key": peer_public_key, "initial_peers": [],
                "report_url": self.report_url, "tokenizer_url": f"{self.url}/api/v1/runs/bengali-albert/tokenizer.json",
                "data_files": [f"{self.url}/api/v1/data/signed/3.txt"]}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def portal():
    fake = FakePortal()
    yield fake
    fake.close()


def test_python_m_peer_agent_shows_help_for_every_command():
    result = subprocess.run([sys.executable, "-m", "peer_agent", "--help"], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0
    for command in ("login", "join", "aggregate", "check", "status"):
        assert command in result.stdout
    join_help = subprocess.run([sys.executable, "-m", "peer_agent", "join", "--help"], cwd=REPO, capture_output=True, text=True)
    assert "--max-runtime" in join_help.stdout and "--client-mode" in join_help.stdout and "RUN" in join_help.stdout
    aggregate_help = subprocess.run([sys.executable, "-m", "peer_agent", "aggregate", "--help"], cwd=REPO,
                                    capture_output=True, text=True)
    words = " ".join(aggregate_help.stdout.split())  # argparse wraps the description
    assert "--bandwidth-mbps" in words and "earns no credit" in words and "RUN" in words


def test_aggregate_refuses_client_mode_before_joining(agent_home_dir, caplog):
    """An aggregator must accept connections: client mode is a usage error, and nothing is asked of the portal."""
    code = cli.main(["aggregate", "--portal", "http://127.0.0.1:9", "--token", TOKEN, "some-run", "--client-mode", "on"])
    assert code == EXIT_USAGE
    assert "cannot run with --client-mode on" in caplog.text


def test_login_checks_the_token_and_stores_it_readable_only_by_you(portal, agent_home_dir, capsys):
    assert cli.main(["login", "--portal", portal.url, "--token", TOKEN]) == 0
    assert "as vik" in capsys.readouterr().out
    stored = agent_home_dir / "credentials.toml"
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600
    assert settings_resolve({}).token == TOKEN and settings_resolve({}).portal == portal.url


def test_login_asks_for_the_token_without_echo(portal, agent_home_dir, monkeypatch):
    monkeypatch.setattr("getpass.getpass", lambda prompt: TOKEN)
    assert cli.main(["login", "--portal", portal.url]) == 0
    assert (agent_home_dir / "credentials.toml").exists()


def test_login_with_a_bad_token_stores_nothing_and_exits_2(portal, agent_home_dir):
    assert cli.main(["login", "--portal", portal.url, "--token", "agt_wrong"]) == 2
    assert not (agent_home_dir / "credentials.toml").exists()


def test_a_flag_beats_the_environment_which_beats_the_config_file_which_beats_the_login(tmp_path, monkeypatch):
    credentials_store("https://portal.example.org", "agt_stored")
    config = tmp_path / "agent.toml"
    config.write_text('portal = "https://portal.example.org"\nrun = "from-file"\nthreads = 2\nreport_interval = 9\n')
    monkeypatch.setenv("PEER_AGENT_THREADS", "3")
    monkeypatch.setenv("PEER_AGENT_MAX_RUNTIME", "90m")
    resolved = settings_resolve({"threads": "4", "run": None}, config_file=config)
    assert (resolved.threads, resolved.run, resolved.report_interval, resolved.max_runtime) == (4, "from-file", 9.0, 5400)
    assert resolved.token == "agt_stored"  # only the login has one
    assert settings_resolve({}, config_file=config).threads == 3
    assert settings_resolve({}).device == "auto" and settings_resolve({}).host == "/ip4/0.0.0.0/tcp/0"


def test_the_stored_token_is_never_sent_to_another_portal(monkeypatch):
    credentials_store("https://portal.example.org", "agt_stored")
    monkeypatch.setenv("PEER_AGENT_PORTAL", "https://elsewhere.example.net")
    assert settings_resolve({}).token is None


def test_bad_settings_say_where_they_came_from(tmp_path, monkeypatch):
    monkeypatch.setenv("PEER_AGENT_THREADS", "many")
    with pytest.raises(SettingsError, match="PEER_AGENT_THREADS"):
        settings_resolve({})
    config = tmp_path / "agent.toml"
    config.write_text('tokne = "x"\n')
    with pytest.raises(SettingsError, match="unknown key"):
        settings_resolve({}, config_file=config)


def test_the_agent_home_follows_xdg_unless_peer_agent_home_is_set():
    assert agent_home({"XDG_CONFIG_HOME": "/x"}) == Path("/x/peer-agent")
    assert agent_home({"XDG_CONFIG_HOME": "/x", "PEER_AGENT_HOME": "/y"}) == Path("/y")


def test_status_shows_sessions_samples_acknowledged_and_pending(agent_home_dir, capsys):
    assert cli.main(["status"]) == 0
    assert "No training sessions" in capsys.readouterr().out
    spool = Spool.open(agent_home_dir / "spool", 7, report_url="ws://x/ws/agent/", run="bengali-albert")
    for seq, samples in enumerate((40, 60, 80), 1):
        spool.add(report(7, seq, samples))
    spool.acked(1)
    spool.acked(2)
    spool.close()
    assert cli.main(["status"]) == 0
    out = capsys.readouterr().out
    assert "bengali-albert" in out
    assert "180 samples reported in 1 session, 100 acknowledged by the portal, 80 in 1 reports waiting" in out


def test_status_speaks_bengali_when_the_environment_asks_for_it(agent_home_dir, capsys, monkeypatch):
    monkeypatch.setenv("LANGUAGE", "bn")
    assert cli.main(["status"]) == 0
    assert "এখনো কোনো প্রশিক্ষণ সেশন লেখা হয়নি" in capsys.readouterr().out
    spool = Spool.open(agent_home_dir / "spool", 7, report_url="ws://x/ws/agent/", run="bengali-albert")
    spool.add(report(7, 1, 40))
    spool.close()
    assert cli.main(["status"]) == 0
    assert "মোট: 1টি সেশনে 40টি নমুনা জানানো হয়েছে" in capsys.readouterr().out
    monkeypatch.setenv("LANGUAGE", "en")
    assert cli.main(["status"]) == 0
    assert "Total: 40 samples reported in 1 session" in capsys.readouterr().out


def test_join_without_a_token_explains_how_to_give_one(portal):
    assert cli.main(["join", "--portal", portal.url, "bengali-albert"]) == 2


@dataclass(frozen=True)
class Progress:
    local_epoch: int = 0
    global_epoch: int = 3
    local_samples_per_second: float = 40.0
    collaboration_samples_per_second: float | None = 400.0
    samples_accumulated: int = 12
    target_batch_size: int = 64
    num_peers: int = 4
    num_clients: int = 1
    eta_next_epoch_s: float = 7.0


class StandInTrainer:
    """Replaces peer_agent.training.Trainer: no swarm, 4 samples per 10 ms step."""

    instances: list["StandInTrainer"] = []
    on_step = None

    def __init__(self, setup, tokenizer):
        self.setup, self.tokenizer, self.steps, self.shut_down = setup, tokenizer, 0, False
        StandInTrainer.instances.append(self)

    def step(self):
        from peer_agent.training import StepResult

        time.sleep(0.01)
        self.steps += 1
        if StandInTrainer.on_step:
            StandInTrainer.on_step(self)
        return StepResult(samples=4, loss=2.0, local_epoch=0, global_epoch=3, samples_per_second=400.0)

    def progress(self):
        return Progress()

    def commitments_take(self):
        return []  # its steps stay in epoch 0, which never closes

    def progress_withdraw(self):
        self.withdrawn = True

    def shutdown(self):
        self.shut_down = True

    def state_keep(self, directory):
        """What Trainer.state_keep leaves: a checkpoint's metadata (the stand-in has no model to save)."""
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "metadata.json").write_text(json.dumps(
            {"run_id": self.setup.run_id, "epoch": 5, "loss": None, "samples": 0, "time": 0.0}))
        self.kept = directory


@pytest.fixture
def stand_in_trainer(monkeypatch):
    import peer_agent.training

    monkeypatch.setattr(peer_agent.training, "Trainer", StandInTrainer)
    monkeypatch.setattr(join, "PAUSE_RETRY_S", 0.2)
    monkeypatch.setattr(join, "RUN_POLL_S", 0.2)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    StandInTrainer.instances, StandInTrainer.on_step = [], None
    yield StandInTrainer
    for sig, handler in handlers.items():
        signal.signal(sig, handler)


@pytest.fixture
def reports():
    server = ContractServer().start()
    yield server
    server.stop()


def join_args(portal: FakePortal, *extra: str) -> list[str]:
    return ["join", "--portal", portal.url, "--token", TOKEN, "--report-interval", "0.2", "--device", "cpu",
            "--host", "/ip4/127.0.0.1/tcp/0", *extra, "bengali-albert"]


def test_join_trains_reports_and_stops_cleanly_at_max_runtime(portal, reports, stand_in_trainer, agent_home_dir):
    portal.report_url = reports.url
    # Six seconds: joining (a key, the tokenizer, the data) took over 1.4 s of a 1.5 s runtime at load 12.
    assert cli.main(join_args(portal, "--max-runtime", "6", "--per-device-batch-size", "2")) == 0
    (trainer,) = stand_in_trainer.instances
    assert trainer.shut_down and trainer.steps > 10
    setup = trainer.setup
    assert setup.run_id == "bengali-albert" and setup.config.training.per_device_batch_size == 2
    assert setup.client_mode is True  # loopback is not reachable from the internet
    assert [Path(path).name for path in setup.data_files] == ["3.txt"]
    assert trainer.tokenizer.pad_token == "[PAD]" and trainer.tokenizer.mask_token == "[MASK]"
    assert portal.joins[0]["device"]["kind"] == "cpu" and portal.joins[0]["device"]["precision"] == "fp32"
    assert portal.joins[0]["per_device_batch_size"] == 2, "the override is declared to the portal at join"
    assert reports.samples(100) == 4 * trainer.steps  # every sample reported exactly once
    assert not spool_read(agent_home_dir / "spool" / "session-100.jsonl")[1].pending


def test_log_format_json_writes_each_log_record_as_a_json_line_naming_the_run_and_session(
        portal, reports, stand_in_trainer, capsys):
    portal.report_url = reports.url
    try:
        assert cli.main([*join_args(portal, "--max-runtime", "1.5", "--log-format", "json")]) == 0
    finally:
        logging.getLogger().handlers[:] = [h for h in logging.getLogger().handlers if not getattr(h, "peer_agent", False)]
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]  # every line on stderr, none of them a progress line
    joined = next(record for record in records if record["message"].startswith("Joined run"))
    assert {"timestamp", "level", "logger", "message"} <= set(joined)
    assert (joined["run"], joined["session_id"], joined["level"]) == ("bengali-albert", 100, "INFO")
    assert records[-1]["session_id"] == 100


def test_ctrl_c_stops_after_the_step_and_exits_0(portal, reports, stand_in_trainer):
    portal.report_url = reports.url
    stand_in_trainer.on_step = lambda trainer: trainer.steps == 5 and signal.raise_signal(signal.SIGINT)
    assert cli.main(join_args(portal)) == 0
    (trainer,) = stand_in_trainer.instances
    assert trainer.steps == 5 and trainer.shut_down and reports.samples(100) == 20


def test_a_paused_run_stops_training_and_the_agent_rejoins_when_it_resumes(portal, reports, stand_in_trainer):
    portal.report_url = reports.url

    def pause(trainer):
        if len(stand_in_trainer.instances) == 1 and trainer.steps == 10:
            portal.status = "paused"

    stand_in_trainer.on_step = pause
    portal.on_refused_join = lambda: setattr(portal, "status", "active")  # the organizer resumes the run
    assert cli.main(join_args(portal, "--max-runtime", "4")) == 0
    first, second = stand_in_trainer.instances
    assert first.shut_down and second.shut_down and portal.refused_joins >= 1
    assert reports.samples(100) == 4 * first.steps and reports.samples(101) == 4 * second.steps
    # The first session kept its state when the pause stopped it; the second starts from it when no peer has one.
    assert first.kept.name == "paused-state" and not hasattr(second, "kept")
    assert second.setup.checkpoint_fetch() == first.kept


def test_a_ban_reported_on_the_socket_ends_the_agent_with_exit_3(portal, stand_in_trainer, agent_home_dir):
    banned = ContractServer(errors={seq: ("banned", "you were banned from run “bengali-albert”") for seq in range(1, 99)})
    banned.start()
    portal.report_url = banned.url
    try:
        assert cli.main(join_args(portal, "--max-runtime", "20")) == 3
    finally:
        banned.stop()
    assert stand_in_trainer.instances[0].shut_down
    assert spool_files(agent_home_dir / "spool")  # the unacknowledged reports stay on disk


def test_check_describes_device_precision_measured_bandwidth_and_client_mode(portal, capsys):
    assert cli.main(["check", "--portal", portal.url, "--token", TOKEN, "--device", "cpu", "bengali-albert"]) == 0
    out = capsys.readouterr().out
    assert "Device:       cpu" in out and "Precision:    fp32" in out
    assert "Bandwidth:    download " in out and "; upload " in out and "not measured" not in out
    assert "Mbit/s, the measured upload" in out and "Client mode:  on" in out
    assert (portal.probes.downloads, portal.probes.uploads) == ([4 << 20], [2 << 20])


@pytest.mark.swarm
def test_check_with_a_backbone_reports_that_it_dialed_this_machine_back(portal, capsys, reap_children):
    from hivemind.dht import DHT

    from peer_agent.reachability import dialback_install, relay_options

    backbone = DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"], startup_timeout=60,
                   **relay_options([], relayed=False))
    try:
        dialback_install(backbone)
        maddr = str(backbone.get_visible_maddrs()[0])
        assert cli.main(["check", "--portal", portal.url, "--token", TOKEN, "--device", "cpu", "--host",
                         "/ip4/127.0.0.1/tcp/0", "--backbone", maddr, "bengali-albert"]) == 0
    finally:
        backbone.shutdown()
    out = capsys.readouterr().out
    assert "Reachability: reachable directly (a backbone peer dialed /ip4/127.0.0.1/tcp/" in out
    assert "Client mode:  off (reachable directly" in out


def test_check_against_an_older_portal_times_the_tokenizer_and_says_upload_was_not_measured(capsys):
    old = FakePortal(probes=False)
    try:
        assert cli.main(["check", "--portal", old.url, "--token", TOKEN, "--device", "cpu", "bengali-albert"]) == 0
    finally:
        old.close()
    out = capsys.readouterr().out
    assert "of tokenizer.json" in out and "upload not measured" in out
    assert "Declared:     10.0 Mbit/s, the run's expected bandwidth" in out


def test_join_declares_the_measured_upload_to_the_swarm(portal, reports, stand_in_trainer):
    portal.report_url = reports.url
    assert cli.main(join_args(portal, "--max-runtime", "0.5", "--bandwidth", "0.5")) == 0
    assert stand_in_trainer.instances[0].setup.bandwidth == 0.5  # --bandwidth caps the (much faster) loopback upload
    assert portal.probes.uploads == [2 << 20]


class EpochStandInTrainer(StandInTrainer):
    """Joins one step before the end of epoch 0; then the third step of each epoch ends it, as
    hivemind's optimizer step does: its result already names the next epoch."""

    def step(self):
        from peer_agent.training import StepResult

        super().step()
        return StepResult(samples=4, loss=2.0, local_epoch=self.epoch, global_epoch=0, samples_per_second=400.0)

    @property
    def epoch(self) -> int:
        return (self.steps + 2) // 3

    def progress(self):
        return replace(super().progress(), local_epoch=self.epoch)


def test_a_report_never_spans_two_epochs_and_counts_each_step_toward_the_epoch_it_began_in(
    portal, reports, stand_in_trainer, monkeypatch
):
    """hivemind counts a step's samples toward the epoch the step began in; the coordinator
    verifies each epoch's reports against those counts."""
    import peer_agent.training
    from peer_agent.reporter import Reporter

    portal.report_url = reports.url
    reported: dict[int, int] = {}
    rates: list[float] = []
    report = Reporter.report

    def recording(self, *, samples, local_epoch, **fields):
        reported[local_epoch] = reported.get(local_epoch, 0) + samples
        rates.append(fields["samples_per_second"])
        return report(self, samples=samples, local_epoch=local_epoch, **fields)

    monkeypatch.setattr(Reporter, "report", recording)
    monkeypatch.setattr(peer_agent.training, "Trainer", EpochStandInTrainer)
    stand_in_trainer.on_step = lambda trainer: trainer.steps == 13 and signal.raise_signal(signal.SIGINT)
    assert cli.main(join_args(portal, "--report-interval", "30")) == 0
    assert reported == {0: 4, 1: 12, 2: 12, 3: 12, 4: 12}
    # Each report's rate covers its own steps' time: 4 samples per >= 10 ms step, never a burst.
    assert rates and max(rates) <= 400.0
