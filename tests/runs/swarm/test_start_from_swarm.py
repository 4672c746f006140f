"""The bar of a run's start: a run started from another run's checkpoint begins at that checkpoint's
held-out loss, not at random init's. Its first evaluation scores the checkpoint's weights; and in a real
swarm on loopback, the coordinator's checkpointer and the first agent start from them."""

import datetime
import functools
import zlib
from pathlib import Path

import pytest
import torch
from django.conf import settings as django_settings
from hivemind.utils.crypto import RSAPrivateKey

from harness.pretraining import model_pretrain, small_config
from harness.processes import children_reap
from peer_agent.authorizer import PortalAuthorizer, rsa_public_key_parse
from peer_agent.checkpoint import checkpoint_unzip
from peer_agent.join import _resume_source
from peer_agent.model import model_build
from peer_agent.protocol import RunConfig
from peer_agent.tokenizer import tokenizer_load
from peer_agent.training import Trainer, TrainerSetup
from runs.access.authority import access_token_sign, authority_load
from runs.evaluation.runner import evaluation_run, heldout_batches, heldout_metrics, heldout_texts
from runs.evaluation.services import evaluations_due
from runs.models import Run
from runs.setup import services, start
from runs.setup.corpus import corpus_lines
from tests.factories import RunFactory
from tests.runs.evaluation_world import checkpoint_train
from tests.runs.evaluation_world import evaluation_run as evaluated_run
from tests.runs.start_world import checkpoint_of, source_run


@pytest.fixture(autouse=True)
def one_torch_thread():
    """As the evaluating process runs (EVALUATION_THREADS); on a loaded host more threads only contend."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def started_run(organizer, source: Run, *, slug: str, lines: int, heldout_size: int, config: dict) -> Run:
    """A new run on the same corpus as ``source`` (so the same held-out documents), started from its
    newest checkpoint through the run form's service, then activated."""
    run = RunFactory(slug=slug, status="draft", tokenizer_status="missing", organizers=[organizer], config=config,
                     heldout_size=heldout_size, hivemind_run_id=f"started-{slug}")
    services.data_file_add(run=run, actor=organizer, name="corpus.txt",
                           content="\n".join(corpus_lines(n_lines=lines)).encode())
    source_of = start.start_source_resolve(text=source.slug, user=organizer, run=run)
    assert start.start_mismatches(source_of, RunConfig.model_validate(config)) == []
    start.run_start_set(run=run, actor=organizer, source=source_of)
    services.run_transition(run=run, actor=organizer, action="activate")
    run.refresh_from_db()
    return run


def scores(found) -> dict:
    """The model's own held-out scores, without the word-frequency baselines' (measured with a baseline)."""
    return {score.metric: score.value for score in found if score.evaluator == "held-out"}


@pytest.mark.slow  # trains a model in-process: CI runs it once, on PostgreSQL (.ci/run)
@pytest.mark.django_db
def test_a_run_started_from_a_checkpoint_is_first_scored_at_that_checkpoints_held_out_loss(organizer, tmp_path):
    """After 100 steps the small model's held-out perplexity is at most 0.34 of its random init's
    (tests/runs/evaluation/test_evaluation.py, docs/benchmarks.md): the started run's first checkpoint scores what the
    source's did, on the same pairs and masks, and half its own random init's at most."""
    source = evaluated_run(organizer)
    trained = scores(evaluation_run(source, checkpoint_train(source, tmp_path, epoch=1, steps=100), save=True))
    run = started_run(organizer, source, slug="started", lines=4000, heldout_size=60, config=small_config())

    assert [(due.slug, checkpoint and checkpoint.epoch) for due, checkpoint in evaluations_due() if due == run] == [
        ("started", None), ("started", 0)], "the baseline, then the start: its first evaluation"
    first = scores(evaluation_run(run, run.checkpoints.get(epoch=0), save=True))
    random_init = scores(evaluation_run(run, None, save=True))
    assert first["perplexity"] == pytest.approx(trained["perplexity"], rel=1e-6)
    assert first["mlm_accuracy"] == pytest.approx(trained["mlm_accuracy"], abs=1e-9)
    assert first["perplexity"] < random_init["perplexity"] / 2
    assert run.evaluations.get(epoch=0).perplexity == first["perplexity"]


@pytest.fixture
def coordinator(settings, tmp_path):
    from runs.swarm.coordinator import Coordinator

    settings.COORDINATOR_STATE_DIR = str(tmp_path / "coordinator")
    coordinator = Coordinator(interval=0.5)
    yield coordinator
    for peer in coordinator.peers.values():
        peer.shutdown()
    children_reap()


def tiny_config() -> dict:
    """test_checkpoint_swarm.py's shape: small enough for two peers' processes on two cores."""
    config = small_config()
    config["model"] = dict(preset="custom", hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=64, embedding_size=16, max_position_embeddings=64)
    config["tokenizer"]["vocab_size"] = 300
    config["data"].update(max_seq_length=32, shuffle_buffer=50)
    config["training"].update(target_batch_size=16, per_device_batch_size=4, warmup_steps=0, total_steps=1000)
    config["averaging"].update(matchmaking_time=1.0, averaging_timeout=5.0)
    return config


def trainer_for(run: Run, *, checkpoint_fetch, kept: Path) -> Trainer:
    """A peer of the run as the agent builds it, resuming as the agent does (peer_agent.join._resume_source)."""
    key = RSAPrivateKey()
    authority = authority_load(encrypted=run.authority_private_key, secret=django_settings.AUTHORITY_ENCRYPTION_KEY)
    fetch_token = functools.partial(access_token_sign, private_key=authority, username="vik",
                                    peer_public_key=key.get_public_key().to_bytes(), lifetime=datetime.timedelta(minutes=10))
    setup = TrainerSetup(
        config=RunConfig.model_validate(run.config), run_id=run.hivemind_run_id, initial_peers=run.initial_peers,
        private_key=key, host_maddrs=["/ip4/127.0.0.1/tcp/0"],
        authorizer=PortalAuthorizer(key, rsa_public_key_parse(run.authority_public_key), fetch_token),
        threads=1, data_files=[run.data_files.get().file.path], progress_refresh_s=1.0,
        checkpoint_fetch=functools.partial(_resume_source, checkpoint_fetch, kept))
    return Trainer(setup, tokenizer_load(run.tokenizer_file.path))


@pytest.mark.swarm
@pytest.mark.timeout(420)
@pytest.mark.django_db(transaction=True)
def test_the_swarm_of_a_started_run_begins_at_the_checkpoints_held_out_loss(organizer, coordinator, tmp_path):
    source = source_run(organizer, lines=600)
    Run.objects.filter(pk=source.pk).update(config=tiny_config())
    source.refresh_from_db()
    tokenizer = tokenizer_load(source.tokenizer_file.path)
    config = RunConfig.model_validate(source.config)
    trained = model_pretrain(config, tokenizer, [source.data_files.get().file.path],
                             init_seed=zlib.crc32(source.hivemind_run_id.encode()), steps=60, batch_size=8)
    checkpoint_of(source, tmp_path, epoch=7, model=trained)
    services.run_transition(run=source, actor=organizer, action="finish")  # the coordinator serves the new run alone
    run = started_run(organizer, source, slug="started-swarm", lines=600, heldout_size=200, config=tiny_config())

    coordinator.sync()
    run.refresh_from_db()
    start_zip = Path(run.checkpoints.get(epoch=0).file.path)
    peer = trainer_for(run, checkpoint_fetch=lambda: checkpoint_unzip(start_zip, tmp_path / "agent"), kept=tmp_path / "kept")
    try:
        batches = heldout_batches(tokenizer_load(run.tokenizer_file.path), config, heldout_texts(run, config))
        random_init = model_build(config, len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                                  init_seed=zlib.crc32(run.hivemind_run_id.encode()))
        expected, at_random = heldout_metrics(trained, batches), heldout_metrics(random_init, batches)
        assert peer.optimizer.local_epoch == 0, "a new run: its own epochs and schedule"
        assert heldout_metrics(peer.model, batches)["perplexity"] == pytest.approx(expected["perplexity"], rel=1e-6)
        assert expected["perplexity"] < at_random["perplexity"] * 0.9, "the checkpoint is not random init's"

        checkpointer = next(iter(coordinator.peers.values())).checkpointer
        for _ in range(40):
            if checkpointer.ready:
                break
            coordinator.sync()
        assert checkpointer.ready
        assert all(torch.equal(ours, theirs) for ours, theirs in zip(
            checkpointer._model.parameters(), trained.parameters(), strict=True)), "the coordinator starts there too"
    finally:
        peer.shutdown()
