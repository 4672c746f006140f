"""Checkpoints without a swarm: when they are due, what retention keeps, and who may download them
(page, API and the signed link in the join answer)."""

import io
import json
import zipfile

import pytest
from django.urls import reverse
from hivemind.utils.crypto import RSAPrivateKey

from accounts.services import token_create
from peer_agent import __version__
from peer_agent.checkpoint import CheckpointMetadata
from peer_agent.join import _checkpoint_fetch, join_request_signed
from peer_agent.metrics import LocalMetrics
from peer_agent.portal import PortalClient
from peer_agent.protocol import DeviceInfo, JoinResponse
from runs.models import Checkpoint, Run, RunMembership
from runs.setup.services import run_ban
from runs.swarm.checkpoints import (
    Checkpointer,
    CheckpointPolicy,
    checkpoint_number,
    checkpoint_save,
    checkpoints_to_delete,
    state_epoch_trusted,
    swarm_reading_of,
)
from tests.agent_wire import post
from tests.factories import RunFactory, join_body
from tests.scrape import scrape

POLICY = CheckpointPolicy(every_epochs=5, every_minutes=30.0, keep_last=3, keep_every_nth=10)


def save(run: Run, tmp_path, epoch: int, policy: CheckpointPolicy = POLICY) -> Checkpoint:
    directory = tmp_path / f"checkpoint-{epoch}"
    directory.mkdir()
    (directory / "model.safetensors").write_bytes(b"weights of epoch %d" % epoch)
    metadata = CheckpointMetadata(run_id=run.hivemind_run_id, epoch=epoch, loss=1.5, samples=epoch * 64, time=0.0)
    return checkpoint_save(run=run, directory=directory, metadata=metadata, policy=policy)


@pytest.mark.parametrize(("swarm_epoch", "last_epoch", "minutes", "due"), [
    (5, 0, 0, True),  # five epochs since the start
    (9, 5, 0, False),  # four epochs and no time: not yet
    (10, 5, 0, True),
    (6, 5, 31, True),  # one epoch, but half an hour passed
    (5, 5, 90, False),  # nothing new to save, however long ago
    (4, 5, 90, False),
])
def test_a_checkpoint_is_due_every_n_epochs_or_m_minutes_once_the_swarm_moved_on(swarm_epoch, last_epoch, minutes, due):
    assert POLICY.due(swarm_epoch=swarm_epoch, last_epoch=last_epoch, seconds_since_last=minutes * 60) is due


def test_an_epoch_only_policy_ignores_time():
    policy = CheckpointPolicy(every_epochs=5, every_minutes=None, keep_last=3, keep_every_nth=None)
    assert not policy.due(swarm_epoch=4, last_epoch=0, seconds_since_last=10**6)


def test_retention_keeps_the_last_k_and_every_nth_for_good(db, tmp_path):
    run = RunFactory()
    for epoch in range(5, 5 * 26, 5):  # 25 checkpoints, numbered 1..25
        save(run, tmp_path, epoch)
    remaining = list(run.checkpoints.order_by("epoch"))
    assert [checkpoint_number(c) for c in remaining] == [10, 20, 23, 24, 25]
    assert [c.epoch for c in remaining] == [50, 100, 115, 120, 125]
    assert [c.kept for c in remaining] == [True, True, False, False, False]
    stored = sorted(path.name for path in (tmp_path / "media" / "checkpoints" / run.hivemind_run_id).iterdir())
    assert stored == [f"{n:06d}-epoch{n * 5}.zip" for n in (10, 20, 23, 24, 25)], "deleted checkpoints' files are gone"


def test_retention_without_every_nth_keeps_only_the_last_k(db, tmp_path):
    run = RunFactory()
    policy = CheckpointPolicy(every_epochs=1, every_minutes=None, keep_last=2, keep_every_nth=None)
    for epoch in range(1, 6):
        save(run, tmp_path, epoch, policy)
    assert [c.epoch for c in run.checkpoints.all()] == [5, 4]


def test_checkpoints_to_delete_never_takes_the_newest_or_kept():
    checkpoints = [Checkpoint(epoch=epoch, kept=epoch == 1) for epoch in (3, 1, 4, 2)]
    assert [c.epoch for c in checkpoints_to_delete(checkpoints, keep_last=2)] == [2]


def test_a_saved_checkpoint_is_a_zip_of_the_directory(db, tmp_path):
    run = RunFactory()
    checkpoint = save(run, tmp_path, 5)
    assert (checkpoint.epoch, checkpoint.loss, checkpoint.samples) == (5, 1.5, 320)
    with checkpoint.file.open("rb") as file, zipfile.ZipFile(io.BytesIO(file.read())) as zipped:
        assert zipped.read("model.safetensors") == b"weights of epoch 5"
    assert checkpoint.size == checkpoint.file.size


def test_checkpoints_saved_and_failed_attempts_are_counted_by_run(db, tmp_path, settings):
    run = RunFactory(slug="counted-run")
    before = scrape(settings)
    save(run, tmp_path, 5)
    save(run, tmp_path, 10)
    # The run is gone when its checkpointer prepares: the attempt fails, and is counted, and the coordinator goes on.
    Checkpointer(run_pk=run.pk + 1000, run_id=run.hivemind_run_id, slug=run.slug, dht=None).tick()
    after = scrape(settings)
    assert after.increase(before, "dedloc_checkpoints_saved_total", run="counted-run") == 2
    assert after.increase(before, "dedloc_checkpoint_failures_total", run="counted-run") == 1


# Who may download: public and unlisted runs' checkpoints are for whoever sees the run; invite-only
# and allowlisted runs' only for their members, organizers and staff. Everyone else gets a 404.
CAN_DOWNLOAD = {
    "public": {"anonymous", "outsider", "volunteer", "organizer", "staff"},
    "unlisted": {"anonymous", "outsider", "volunteer", "organizer", "staff"},
    "invite": {"volunteer", "organizer", "staff"},
    "allowlist": {"volunteer", "organizer", "staff"},
}


@pytest.fixture
def people(organizer, volunteer, outsider, staff):
    return {"anonymous": None, "outsider": outsider, "volunteer": volunteer, "organizer": organizer, "staff": staff}


def run_with_checkpoint(visibility: str, people: dict, tmp_path) -> Run:
    run = RunFactory(slug="the-run", visibility=visibility, organizers=[people["organizer"]])
    if visibility == "invite":
        RunMembership.objects.create(run=run, user=people["volunteer"])
    if visibility == "allowlist":
        run.allowlist.add(people["volunteer"])
    save(run, tmp_path, 5)
    return run


@pytest.mark.parametrize("visibility", list(CAN_DOWNLOAD))
@pytest.mark.parametrize("who", ["anonymous", "outsider", "volunteer", "organizer", "staff"])
def test_checkpoint_download_page_and_api_follow_the_run_visibility(client_for, people, tmp_path, visibility, who):
    run_with_checkpoint(visibility, people, tmp_path)
    client = client_for(people[who])
    download = client.get(reverse("run-checkpoint", args=["the-run", 5]))
    listing = client.get("/api/v1/runs/the-run/checkpoints")
    page = client.get(reverse("run-detail", args=["the-run"]))
    if who in CAN_DOWNLOAD[visibility]:
        assert download.status_code == 200
        assert download["Content-Disposition"] == 'attachment; filename="the-run-epoch5.zip"'
        names = zipfile.ZipFile(io.BytesIO(b"".join(download.streaming_content))).namelist()
        assert names == ["README.md", "model.safetensors"], "the model card goes with the weights"
        assert listing.status_code == 200
        [entry] = listing.json()
        assert (entry["epoch"], entry["loss"], entry["kept"]) == (5, 1.5, False)
        assert entry["download_url"] == "http://testserver/runs/the-run/checkpoints/epoch-5.zip"
        assert b'href="/runs/the-run/checkpoints/epoch-5.zip"' in page.content
    else:
        assert download.status_code == 404
        assert listing.status_code == 404
        assert listing.json()["error"]["code"] == "run_not_found"
        assert b"/checkpoints/epoch-5.zip" not in page.content


def test_an_unknown_epoch_is_a_404(client, db, tmp_path):
    save(RunFactory(slug="the-run"), tmp_path, 5)
    assert client.get(reverse("run-checkpoint", args=["the-run", 6])).status_code == 404


def test_a_draft_runs_checkpoints_stay_hidden(client, db, tmp_path):
    run = RunFactory(slug="the-run", status=Run.Status.DRAFT)
    save(run, tmp_path, 5)
    assert client.get(reverse("run-checkpoint", args=["the-run", 5])).status_code == 404
    assert client.get("/api/v1/runs/the-run/checkpoints").status_code == 404


def test_the_join_answer_links_the_newest_checkpoint_for_the_agent_alone(client, organizer, volunteer, tmp_path):
    run = RunFactory(slug="the-run", visibility="invite", organizers=[organizer])
    RunMembership.objects.create(run=run, user=volunteer)
    secret = token_create(user=volunteer, name="laptop")[1]
    before = post(client, "/api/v1/runs/the-run/join", secret, join_body("the-run")).json()
    assert JoinResponse.model_validate(before).checkpoint_url is None

    save(run, tmp_path, 5)
    save(run, tmp_path, 10)
    answer = JoinResponse.model_validate(post(client, "/api/v1/runs/the-run/join", secret, join_body("the-run")).json())
    path = answer.checkpoint_url.removeprefix("http://testserver")
    served = client.get(path)  # no session, no token: the link is signed
    assert served.status_code == 200
    with zipfile.ZipFile(io.BytesIO(b"".join(served.streaming_content))) as zipped:
        assert zipped.read("model.safetensors") == b"weights of epoch 10"

    token, checkpoint_id = path.removeprefix("/api/v1/checkpoints/").removesuffix(".zip").split("/")
    assert client.get(f"/api/v1/checkpoints/{token}x/{checkpoint_id}.zip").status_code == 404, "a forged link"
    assert client.get(f"/api/v1/checkpoints/{token}/{int(checkpoint_id) - 1}.zip").status_code == 404
    run_ban(run=run, actor=organizer, user=volunteer)
    refused = client.get(path)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "banned"


def test_a_checkpoint_link_dies_with_its_checkpoint(client, volunteer, tmp_path):
    run = RunFactory(slug="the-run")
    secret = token_create(user=volunteer, name="laptop")[1]
    policy = CheckpointPolicy(every_epochs=1, every_minutes=None, keep_last=1, keep_every_nth=None)
    save(run, tmp_path, 5, policy)
    url = post(client, "/api/v1/runs/the-run/join", secret, join_body("the-run")).json()["checkpoint_url"]
    save(run, tmp_path, 10, policy)
    gone = client.get(url.removeprefix("http://testserver"))
    assert gone.status_code == 404
    assert "newer checkpoint" in json.loads(gone.content)["error"]["detail"]


@pytest.fixture
def joined(asgi_server, volunteer):
    """``joined(run)``: a portal client of the volunteer's agent and its join answer, over real HTTP."""
    clients = []

    def join(run: Run):
        portal = PortalClient(asgi_server, token_create(user=volunteer, name="laptop")[1])
        clients.append(portal)
        request = join_request_signed(RSAPrivateKey(), run=run.slug, agent_version=__version__,
                                      device=DeviceInfo(kind="cpu", name="test CPU"))
        return portal, portal.join(run.slug, request)

    yield join
    for portal in clients:
        portal.close()


def test_the_agent_downloads_the_newest_checkpoint_once(joined, tmp_path):
    run = RunFactory(slug="the-run")
    save(run, tmp_path, 5)
    portal, answer = joined(run)
    first = _checkpoint_fetch(portal, answer.checkpoint_url, tmp_path / "agent")
    assert (first / "model.safetensors").read_bytes() == b"weights of epoch 5"
    (first / "model.safetensors").write_bytes(b"touched")
    assert _checkpoint_fetch(portal, answer.checkpoint_url, tmp_path / "agent") == first
    assert (first / "model.safetensors").read_bytes() == b"weights of epoch 5", "unzipped again from the kept download"


def test_the_agent_starts_afresh_when_the_checkpoint_is_gone_or_broken(joined, tmp_path):
    run = RunFactory(slug="the-run")
    checkpoint = save(run, tmp_path, 5)
    portal, answer = joined(run)
    with checkpoint.file.open("wb") as file:
        file.write(b"not a zip")
    assert _checkpoint_fetch(portal, answer.checkpoint_url, tmp_path / "broken") is None
    checkpoint.delete()
    assert _checkpoint_fetch(portal, answer.checkpoint_url, tmp_path / "gone") is None


def metrics(step: int, loss: float = 4.0) -> LocalMetrics:
    return LocalMetrics(step=step, samples_per_second=10.0, samples_accumulated=32, loss=loss, mini_steps=4)


def reading_of(*records: LocalMetrics, left: tuple[LocalMetrics, ...] = ()):
    """The checkpointer's reading of ``records`` from peers in the swarm and ``left`` from peers gone from it."""
    present = {b"[owner:peer %d]" % index: record for index, record in enumerate(records)}
    gone = {b"[owner:gone %d]" % index: record for index, record in enumerate(left)}
    return swarm_reading_of({**present, **gone}, present=present.keys())


def test_one_member_announcing_a_far_epoch_moves_neither_the_checkpointers_epoch_nor_its_trust():
    honest = [metrics(7, loss=4.0), metrics(7, loss=3.0), metrics(6, loss=5.0)]
    liar = metrics(10**6, loss=0.01)
    reading = reading_of(*honest, liar)
    assert (reading.epoch, reading.loss) == (7, 3.5)
    assert reading_of(honest[0], liar).epoch == 7, "one honest peer and one liar: the honest epoch"
    assert reading_of() is None
    assert state_epoch_trusted(state_epoch=8, swarm_epoch=7)
    assert not state_epoch_trusted(state_epoch=10**6, swarm_epoch=7), "a served state past the swarm is refused"


def test_the_records_of_peers_that_left_do_not_hold_the_reading_back():
    # After a pause both agents join again with new peer keys; the old sessions' metrics outlive them.
    paused = (metrics(4, loss=6.0), metrics(5, loss=6.0))
    reading = reading_of(metrics(9, loss=3.0), metrics(8, loss=3.5), left=paused)
    assert (reading.epoch, reading.loss) == (8, 3.5), "only the peers in the swarm count"
    assert state_epoch_trusted(state_epoch=9, swarm_epoch=reading.epoch), "the new peers' states are not refused"
    assert reading_of(left=paused) is None, "nobody in the swarm: no reading"


def test_the_checkpointers_download_asks_no_peer_declaring_an_epoch_past_its_bound():
    """A member declaring a far epoch would be asked first by hivemind every time, its state refused
    every time, and no checkpoint saved while it stayed online (runs/swarm/state.py)."""
    import multiprocessing

    from hivemind.utils.timed_storage import ValueWithExpiration

    from runs.swarm.state import BoundedSourceStateAverager

    class Bounded:
        _epoch_bound = multiprocessing.Value("d", 8.0)

    declared = {b"far": ValueWithExpiration(10**6, 99.0), b"amina": ValueWithExpiration(7, 99.0),
                b"next": ValueWithExpiration(8, 99.0)}
    assert set(BoundedSourceStateAverager.state_sources_choose(Bounded(), declared)) == {b"amina", b"next"}
