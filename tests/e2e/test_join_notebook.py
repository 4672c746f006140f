"""The join page's notebook, executed by nbclient in a real kernel against a live portal (issue 32): it installs
the agent from the portal's wheel, takes the token typed into getpass, checks the machine and joins; the
volunteer's epochs are verified beside an honest agent's; interrupting the kernel stops the agent cleanly;
and the token is nowhere in the executed notebook.

The kernel runs in a fresh virtualenv that sees the project's installed packages (torch, hivemind, ipykernel)
through a .pth file, but not its source: the agent it runs is the one the notebook installs. pip may use no
package index (PIP_NO_INDEX): nothing is downloaded."""

import asyncio
import json
import os
import signal
import sys
import threading
import venv

import httpx
import nbformat
import pytest
from django.core.management import call_command
from nbclient import NotebookClient

from accounts.services import token_create
from harness.processes import children_reap
from runs.models import Run, SessionEpoch
from tests.e2e.agents import agent, serve_until, small_run
from tests.factories import UserFactory

pytestmark = [pytest.mark.swarm, pytest.mark.timeout(900)]


def scratch_kernel(home, environment: dict) -> str:
    """A kernel spec named "scratch" under ``home``/jupyter (put JUPYTER_PATH there) for a new virtualenv
    whose only other packages are the project's installed ones, with ``environment`` set."""
    venv.EnvBuilder(with_pip=False).create(home / "venv")
    site_packages = next((home / "venv" / "lib").glob("python3*/site-packages"))
    (site_packages / "project.pth").write_text("\n".join(p for p in sys.path if p.endswith("site-packages")) + "\n")
    spec = home / "jupyter" / "kernels" / "scratch"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [str(home / "venv" / "bin" / "python"), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "scratch", "language": "python", "env": environment,
    }))
    return "scratch"


def typing_into_getpass(client: NotebookClient, secret: str):
    """An ``on_notebook_start`` hook: answer every input request of the kernel (getpass) with ``secret``, as a
    volunteer types it. nbclient itself refuses input requests."""

    def start(notebook) -> None:
        client.kc.allow_stdin = True

        async def answer() -> None:
            while True:
                message = await client.kc.stdin_channel.get_msg()
                if message["msg_type"] == "input_request":
                    client.kc.input(secret)

        answering = asyncio.get_running_loop().create_task(answer())
        client.on_notebook_complete = lambda notebook: answering.cancel()

    return start


def test_the_join_notebook_installs_the_agent_joins_with_a_typed_token_and_earns_confirmed_credit(
    asgi_server, coordinator, organizer, settings, tmp_path, monkeypatch
):
    settings.MEDIA_ROOT = tmp_path / "media"
    call_command("agent_wheel", verbosity=0)
    run = small_run(organizer)
    serve_until(coordinator, lambda: Run.objects.get(pk=run.pk).initial_peers, 60, "the backbone peer")
    volunteer, rahim = UserFactory(username="nadia"), UserFactory(username="rahim")
    secret = token_create(user=volunteer, name="notebook", run=run)[1]
    notebook = nbformat.reads(httpx.get(f"{asgi_server}/runs/{run.slug}/join/notebook.ipynb").text, as_version=4)

    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.delenv("PEER_AGENT_TOKEN", raising=False)
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    kernel = scratch_kernel(tmp_path, {
        "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PEER_AGENT_HOME": str(tmp_path / "nadia"),
        "PEER_AGENT_THREADS": "1", "PEER_AGENT_HOST": "/ip4/127.0.0.1/tcp/0", "PEER_AGENT_CLIENT_MODE": "off",
        "PEER_AGENT_REPORT_INTERVAL": "2", "PEER_AGENT_MAX_RUNTIME": "420s",  # a bound, should the interrupt not come
    })
    client = NotebookClient(notebook, kernel_name=kernel, timeout=600, startup_timeout=120,
                            resources={"metadata": {"path": str(tmp_path)}})
    client.on_notebook_start = typing_into_getpass(client, secret)
    failures = []

    def execute() -> None:
        try:
            client.execute()
        except Exception as exc:  # noqa: BLE001 - reported in the test's thread
            failures.append(exc)

    honest = agent(asgi_server, token_create(user=rahim, name="e2e")[1], tmp_path / "rahim", "420s")
    executing = threading.Thread(target=execute, daemon=True)
    executing.start()
    try:
        serve_until(coordinator, lambda: failures or SessionEpoch.objects.filter(
            session__user=volunteer, status="verified").count() >= 2, 600, "two verified epochs of the notebook's agent")
        assert not failures, failures
        os.kill(client.km.provisioner.pid, signal.SIGINT)  # the notebook's ■
        serve_until(coordinator, lambda: not executing.is_alive(), 60, "the notebook's last cell to end")
    finally:
        if honest.poll() is None:
            os.killpg(honest.pid, signal.SIGKILL)
        children_reap()
    assert not failures, failures

    installed = next((tmp_path / "venv" / "lib").glob("python3*/site-packages/peer_agent/notebook.py"), None)
    assert installed is not None, "the notebook installed the agent from the portal's wheel"
    executed = nbformat.writes(client.nb)
    assert secret not in executed, "the token reached the notebook's file"
    panel = json.dumps(client.nb.cells[-1].outputs)
    assert "stopped (exit status 0)" in panel, panel
    assert "Device:" in json.dumps(client.nb.cells[-2].outputs), "the check cell showed the machine"
    confirmed = SessionEpoch.objects.filter(session__user=volunteer, status="verified")
    assert sum(row.reported_samples for row in confirmed) > 0
