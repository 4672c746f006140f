"""Fixtures for the peer agent's tests: a small corpus, a tokenizer trained on it, a tiny run
config, and a reaper for the processes hivemind leaves behind. Nothing here needs Django."""

import pytest
import torch

from harness import tiny_swarm
from harness.processes import children_reap
from harness.tiny_swarm import corpus_write, tokenizer_train, trainer_make


@pytest.fixture
def reap_children():
    """Kill the child processes (DHT, averagers, p2pd) a test leaves running once its peers are shut down."""
    yield
    children_reap()


@pytest.fixture
def torch_threads():
    """Restore torch's thread count after a test that changes it."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def corpus_file(tmp_path_factory):
    return corpus_write(tmp_path_factory.mktemp("corpus") / "corpus.txt")


@pytest.fixture(scope="session")
def tokenizer(corpus_file):
    return tokenizer_train(corpus_file)


@pytest.fixture(scope="session")
def tiny_config():
    """``tiny_config(training={...})``: harness.tiny_swarm's run config, with sections overridden field by field."""
    return tiny_swarm.tiny_config


@pytest.fixture
def make_trainer(tokenizer, corpus_file):
    """``make_trainer(seed, joins=other_trainer, client_mode=..., averaging={...}, training={...})``
    (harness.tiny_swarm.trainer_make); every trainer is shut down after the test."""
    trainers = []

    def make(seed, **options):
        trainers.append(trainer_make(tokenizer, corpus_file, seed, **options))
        return trainers[-1]

    yield make
    for trainer in trainers:
        trainer.shutdown()
