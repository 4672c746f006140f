"""A real swarm on loopback: the coordinator's checkpointer saves the collaboration's state while a
peer trains; the checkpoint appears on the run page, loads in `transformers` and fills a mask; and
a peer that later finds nobody online resumes from it through the agent's own download path."""

import datetime
import functools
import logging
import time

import pytest
import torch
from django.conf import settings as django_settings
from hivemind.utils.crypto import RSAPrivateKey
from transformers import AlbertForMaskedLM, AlbertForPreTraining, PreTrainedTokenizerFast, pipeline

from accounts.services import token_create
from harness.processes import children_reap
from peer_agent import __version__
from peer_agent.authorizer import PortalAuthorizer, rsa_public_key_parse
from peer_agent.checkpoint import checkpoint_metadata, checkpoint_unzip
from peer_agent.device import device_info
from peer_agent.join import _checkpoint_fetch, join_request_signed
from peer_agent.portal import PortalClient
from peer_agent.protocol import RunConfig
from peer_agent.tokenizer import tokenizer_load
from peer_agent.training import Trainer, TrainerSetup
from runs.access.authority import access_token_sign, authority_load
from runs.models import Checkpoint
from runs.setup import services
from runs.setup.corpus import corpus_lines
from runs.setup.forms import preset_config
from runs.swarm.checkpoints import STATE_CHUNK_TIMEOUT_S
from runs.swarm.coordinator import Coordinator
from tests.factories import RunFactory

pytestmark = [pytest.mark.swarm, pytest.mark.timeout(420), pytest.mark.django_db(transaction=True)]

DEADLINE_S = 180
STEP_TIME_S = 0.1  # stands in for compute, so the peer's progress records keep up


@pytest.fixture
def run(organizer):
    config = preset_config("tiny").model_dump(mode="json")
    config["model"] = dict(preset="custom", hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=64, embedding_size=16, max_position_embeddings=64)
    config["tokenizer"]["vocab_size"] = 300
    config["data"].update(max_seq_length=32, shuffle_buffer=50)
    config["training"].update(target_batch_size=16, per_device_batch_size=4, warmup_steps=0, total_steps=1000)
    config["averaging"].update(matchmaking_time=1.0, averaging_timeout=5.0, checkpoint_every_epochs=2,
                               checkpoint_every_minutes=None, keep_last_checkpoints=2, keep_every_nth_checkpoint=None)
    run = RunFactory(slug="ckpt-run", status="draft", tokenizer_status="missing", organizers=[organizer], config=config)
    services.data_file_add(run=run, actor=organizer, name="corpus.txt", content="\n".join(corpus_lines(n_lines=600)).encode())
    services.tokenizer_train(run_id=run.pk)
    services.run_transition(run=run, actor=organizer, action="activate")
    run.refresh_from_db()
    return run


@pytest.fixture
def coordinator(settings, tmp_path):
    """A coordinator whose cycles the test drives from its main thread, as `run_coordinator` does."""
    settings.COORDINATOR_STATE_DIR = str(tmp_path / "coordinator")
    coordinator = Coordinator(interval=0.5)
    coordinator.sync()
    for peer in coordinator.peers.values():
        peer.checkpointer.check_period, peer.checkpointer.retry_period = 0.5, 1.0
    yield coordinator
    for peer in coordinator.peers.values():
        peer.shutdown()
    children_reap()


@pytest.fixture
def make_trainer(run):
    trainers = []

    def make(*, checkpoint_fetch=None, initial_peers=None, client_mode=False) -> Trainer:
        run.refresh_from_db()
        key = RSAPrivateKey()
        authority = authority_load(encrypted=run.authority_private_key, secret=django_settings.AUTHORITY_ENCRYPTION_KEY)
        public = key.get_public_key().to_bytes()
        fetch_token = functools.partial(access_token_sign, private_key=authority, username="vik", peer_public_key=public,
                                        lifetime=datetime.timedelta(minutes=10))
        setup = TrainerSetup(
            config=RunConfig.model_validate(run.config), run_id=run.hivemind_run_id,
            initial_peers=initial_peers or run.initial_peers, private_key=key, client_mode=client_mode,
            host_maddrs=["/ip4/127.0.0.1/tcp/0"],
            authorizer=PortalAuthorizer(key, rsa_public_key_parse(run.authority_public_key), fetch_token),
            threads=1, data_files=[run.data_files.get().file.path], progress_refresh_s=1.0, checkpoint_fetch=checkpoint_fetch)
        trainers.append(Trainer(setup, tokenizer_load(run.tokenizer_file.path)))
        return trainers[-1]

    yield make
    for trainer in trainers:
        trainer.shutdown()


def train_until(trainer: Trainer | None, coordinator: Coordinator, condition, what: str) -> None:
    """Step the trainer (if any) and run the coordinator's cycles until ``condition`` holds."""
    deadline, synced_at = time.monotonic() + DEADLINE_S, time.monotonic()
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        if trainer is not None:
            trainer.step()
        if time.monotonic() - synced_at >= coordinator.interval:
            coordinator.sync()
            synced_at = time.monotonic()
        time.sleep(STEP_TIME_S)


def parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: param.detach().clone() for name, param in model.named_parameters()}


def test_a_checkpoint_of_the_swarm_loads_in_transformers_and_restarts_an_empty_swarm(
        run, coordinator, make_trainer, volunteer, asgi_server, client, tmp_path):
    first = make_trainer()
    train_until(first, coordinator, lambda: run.checkpoints.exists(), "the coordinator's first checkpoint")
    checkpoint = run.checkpoints.get()
    assert checkpoint.epoch >= 2, "checkpoints every 2 epochs, never of the untrained epoch 0"
    # A busy volunteer's uplink stalls for seconds: the download waits STATE_CHUNK_TIMEOUT_S, not hivemind's 3 s.
    assert coordinator.peers[run.pk].validator.checkpointer._averager.next_chunk_timeout == STATE_CHUNK_TIMEOUT_S
    assert checkpoint.epoch <= first.optimizer.local_epoch
    first.shutdown()  # every peer leaves: nobody online holds the collaboration's state now

    page = client.get(f"/runs/{run.slug}/")
    assert f'href="/runs/{run.slug}/checkpoints/epoch-{checkpoint.epoch}.zip"'.encode() in page.content
    download = client.get(f"/runs/{run.slug}/checkpoints/epoch-{checkpoint.epoch}.zip")
    archive = tmp_path / "downloaded.zip"
    archive.write_bytes(b"".join(download.streaming_content))
    directory = checkpoint_unzip(archive, tmp_path / "downloaded")
    assert checkpoint_metadata(directory).epoch == checkpoint.epoch

    model, loading = AlbertForMaskedLM.from_pretrained(directory, output_loading_info=True)
    assert not loading["missing_keys"], "the masked-LM head is all there"
    tokenizer = PreTrainedTokenizerFast.from_pretrained(directory)
    filled = pipeline("fill-mask", model=model, tokenizer=tokenizer, device="cpu")(f"আমি {tokenizer.mask_token} গান গাই")
    assert filled and isinstance(filled[0]["token_str"], str) and filled[0]["token"] in tokenizer.get_vocab().values()

    # A volunteer joins through the API; its agent finds no peer to download from, so it fetches the
    # checkpoint by the signed link in the join answer and continues from there.
    secret = token_create(user=volunteer, name="laptop")[1]
    with PortalClient(asgi_server, secret) as portal:
        key = RSAPrivateKey()
        joined = portal.join(run.slug, join_request_signed(key, run=run.slug, agent_version=__version__,
                                                           device=device_info(torch.device("cpu"), "fp32")))
        assert joined.checkpoint_url is not None
        fetch = functools.partial(_checkpoint_fetch, portal, joined.checkpoint_url, tmp_path / "agent")
        second = make_trainer(checkpoint_fetch=fetch, initial_peers=joined.initial_peers)
    saved = parameters(AlbertForPreTraining.from_pretrained(directory))
    resumed = parameters(second.model)
    assert resumed.keys() == saved.keys()
    assert all(torch.equal(resumed[name], saved[name]) for name in saved), "the new peer starts from the checkpoint"
    assert second.optimizer.local_epoch == checkpoint.epoch
    saved_state = torch.load(directory / "optimizer.pt", weights_only=True)["state"]
    resumed_state = second.optimizer.opt.state_dict()["state"]
    assert all(torch.equal(resumed_state[index]["exp_avg_sq"], saved_state[index]["exp_avg_sq"])
               for index in resumed_state), "and from its LAMB statistics"
    epoch_before = second.optimizer.local_epoch
    train_until(second, coordinator, lambda: second.optimizer.local_epoch > epoch_before, "the resumed peer's next epoch")
    assert second.optimizer.local_epoch == checkpoint.epoch + 1, "its epochs continue from the checkpoint's"


def test_the_checkpointer_retries_while_no_peer_shares_its_state(run, coordinator, make_trainer, caplog):
    """The only peer trains in client mode, which never serves its state: the checkpointer sees
    the epochs go by, saves nothing, says why, and keeps trying."""
    caplog.set_level(logging.INFO, logger="runs.swarm.checkpoints")
    client = make_trainer(client_mode=True)
    train_until(client, coordinator, lambda: caplog.text.count("no peer shared a state newer than epoch 0") >= 2,
                "two attempts to download the state")
    assert client.optimizer.local_epoch >= 2
    assert not Checkpoint.objects.filter(run=run).exists()


def test_a_member_declaring_a_far_epoch_is_not_asked_for_the_state(run, coordinator, make_trainer):
    """hivemind downloads from the peer that declares the highest epoch. A member that declares a far
    one (and holds only the untrained state) would be asked first on every attempt, and no checkpoint
    would ever be saved while it stays online; the checkpointer leaves it out of the choice."""
    honest = make_trainer()
    far = make_trainer()  # joins at epoch 0 and never trains
    far.optimizer.state_averager.state_sharing_priority = 10**6
    train_until(honest, coordinator, lambda: run.checkpoints.exists(), "a checkpoint despite the far member")
    assert run.checkpoints.get().epoch >= 2
    assert far.optimizer.local_epoch == 0 and far.optimizer.state_averager.state_sharing_priority == 10**6


def test_a_peer_serves_the_state_its_past_steps_were_computed_at_when_asked_by_their_sketch(
        run, coordinator, make_trainer):
    """The validator holds each epoch's state by downloading what peers serve at the moment, and on a loaded
    machine it missed some (every step of such an epoch earned nothing). An agent keeps the states of its
    last steps (peer_agent.averaging.EpochStates) and serves one asked for by epoch and parameters'
    sketch: the sketch its commitment claims. Another sketch gets nothing."""
    from peer_agent.spotcheck import Sketch, fingerprint_distance, fingerprint_encode
    from runs.swarm.spotcheck import STATE_EXACT, parameters_apart

    trainer = make_trainer()
    committed: list = []
    train_until(trainer, coordinator, lambda: committed.extend(trainer.commitments_take()) or (
        len({commitment.epoch for commitment in committed}) >= 3), "three closed epochs")
    checkpointer = next(iter(coordinator.peers.values())).checkpointer
    train_until(None, coordinator, lambda: checkpointer.ready, "the checkpointer's averager")
    peer = str(trainer.optimizer.state_averager.peer_id)
    first = committed[0]
    epoch, sketch = first.epoch, first.steps[0].parameters
    served = checkpointer.state_download_from(peer, timeout=30, silence=30, kept=(epoch, sketch))
    assert served is not None, "the kept state of the first closed epoch"
    assert served[0] == epoch
    kept = served[1]
    assert fingerprint_distance(sketch, fingerprint_encode(Sketch(run.hivemind_run_id, epoch, kept).apply(kept))) <= STATE_EXACT
    now = [parameter.detach().float() for parameter in trainer.model.parameters()]
    assert parameters_apart(kept, now) > 1e-3, "a past state, not the one the peer serves now"
    other = committed[-1].steps[0].parameters
    assert checkpointer.state_download_from(peer, timeout=30, silence=30, kept=(epoch, other)) is None, \
        "the sketch of another epoch"
    assert checkpointer.state_download_from(peer, timeout=30, silence=30, kept=(epoch + 1000, sketch)) is None


def test_a_peer_whose_process_is_gone_is_unreachable_not_silent(run, coordinator, make_trainer):
    """A killed peer stays declared as a state source for hivemind's declare period (30 s); the validator
    holds its survivor's state meanwhile because no stream to the killed peer opens (runs/swarm/spotcheck.py,
    ``Validator._hold``), unlike a live peer's."""
    from peer_agent.averaging import UNREACHABLE

    trainer = make_trainer()
    checkpointer = next(iter(coordinator.peers.values())).checkpointer
    train_until(trainer, coordinator, lambda: checkpointer.ready and trainer.optimizer.local_epoch >= 1,
                "the checkpointer's averager and a first epoch")
    peer = str(trainer.optimizer.state_averager.peer_id)
    served = checkpointer.state_download_from(peer, timeout=30, silence=30)
    assert isinstance(served, tuple) and served[0] >= 1, "a live peer serves its state"
    # The holder asks for the parameters only (peer_agent.averaging.EpochStateServing), not LAMB's two moments:
    # a third of the bytes of hivemind's whole state, 217 MB at sahajBERT's size (docs/benchmarks.md, section 28).
    metadata, tensors = checkpointer._averager.state_download_from(peer, timeout=30, silence=30)
    shapes = [parameter.shape for parameter in trainer.model.parameters()]
    assert metadata["epoch"] >= 1 and sorted(tensor.shape for tensor in tensors) == sorted(shapes)
    assert all(tensor.dtype == torch.float32 for tensor in tensors)
    trainer.shutdown()  # its daemon stops with it, as a killed agent's does with its process group
    started = time.monotonic()
    assert checkpointer.state_download_from(peer, timeout=30, silence=30) == UNREACHABLE
    print(f"unreachable after {time.monotonic() - started:.2f} s")


def test_a_peer_whose_state_arrived_an_epoch_late_loads_the_swarms_parameters_and_trains_on(
        run, coordinator, make_trainer):
    """A state that took longer than an epoch to download arrives an epoch old, and hivemind would send the peer
    back for all of it at its first step, and again (docs/benchmarks.md, section 28: a late joiner at 10 Mbit/s
    never trained). The peer catches up with the parameters alone (``MembersOnlyOptimizer.catch_up``): it then
    holds exactly what the swarm serves for its epoch, and trains on without another download. A source that
    serves an epoch past what it declared is passed over (a liar would move the peer far past the swarm). Nor
    does a peer serve its gradient buffers, which hivemind downloads after each state and drops."""
    first = make_trainer()
    train_until(first, coordinator, lambda: first.optimizer.local_epoch >= 2, "two epochs")
    joiner, liar = make_trainer(), make_trainer()
    loaded = joiner.optimizer.local_epoch
    assert loaded == liar.optimizer.local_epoch == first.optimizer.local_epoch and joiner.optimizer.state_loads == 1
    train_until(first, coordinator, lambda: first.optimizer.local_epoch >= loaded + 2,
                "the swarm two epochs on, as during a slow download")
    swarm_epoch = first.optimizer.local_epoch
    # The liar declares one epoch past the swarm (the highest the choice of sources allows, so it is asked first)
    # and serves its old parameters as a far epoch's.
    liar.optimizer.state_averager.local_epoch = swarm_epoch + 100
    liar.optimizer.state_averager.state_sharing_priority = swarm_epoch + 1
    liar_id = liar.optimizer.state_averager.peer_id.to_bytes()
    prefix = f"{joiner.optimizer.state_averager.prefix}.all_averagers"

    def liar_declared() -> bool:
        found = joiner.dht.get(prefix, latest=True)
        entry = found.value.get(liar_id) if found is not None and isinstance(found.value, dict) else None
        return entry is not None and entry.value == swarm_epoch + 1
    train_until(None, coordinator, liar_declared, "the liar's declaration")
    joiner.optimizer.catch_up()
    assert joiner.optimizer.local_epoch == swarm_epoch
    ours, swarms = parameters(joiner.model), parameters(first.model)
    assert all(torch.equal(ours[name], swarms[name]) for name in swarms), "the swarm's parameters, exactly"
    steps = 0

    def trained() -> bool:
        nonlocal steps
        steps += 1
        return steps > 6
    train_until(joiner, coordinator, trained, "the caught-up peer's steps")
    assert joiner.optimizer.state_loads == 1, "no download of the swarm's state again"
    assert not first.optimizer.grad_averager.allow_state_sharing
