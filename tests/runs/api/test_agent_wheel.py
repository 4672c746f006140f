"""The portal builds the peer-agent wheel and serves it at the address the join page shows."""

import re
import zipfile

from django.core.management import call_command

from tests.factories import RunFactory


def test_the_wheel_is_built_served_and_named_on_the_join_page(client_for, volunteer, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path
    call_command("agent_wheel", verbosity=0)
    run = RunFactory()
    page = client_for(volunteer).get(f"/runs/{run.slug}/join/").content.decode()
    install = re.search(r'id="install-command">pip install http://testserver(/agent/(peer_agent-[^<]+\.whl))<', page)
    assert install, page
    response = client_for(None).get(install.group(1))
    assert response.status_code == 200
    wheel = tmp_path / "downloaded.whl"
    wheel.write_bytes(b"".join(response.streaming_content))
    names = zipfile.ZipFile(wheel).namelist()
    assert "peer_agent/protocol.py" in names and "peer_agent/cli.py" in names
    assert "peer_agent/locale/bn/LC_MESSAGES/peer_agent.mo" in names  # the CLI speaks Bengali once installed
    entry_points = next(name for name in names if name.endswith("entry_points.txt"))
    assert "peer-agent = peer_agent.cli:run" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_an_unknown_wheel_name_is_404(client, db):
    assert client.get("/agent/peer_agent-9.9.9-py3-none-any.whl").status_code == 404
