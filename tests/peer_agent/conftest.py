"""Fixtures for the peer agent's tests: a small corpus, a tokenizer trained on it, a tiny run
config, and a reaper for the processes hivemind leaves behind. Nothing here needs Django."""

import random

import pytest
import torch
from hivemind.utils.crypto import RSAPrivateKey
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from harness.processes import children_reap
from peer_agent.protocol import SPECIAL_TOKENS, RunConfig
from peer_agent.training import Trainer, TrainerSetup

SUBJECTS = ["the cat", "a dog", "my friend", "the teacher", "our neighbour", "the farmer"]
VERBS = ["eats", "sees", "likes", "finds", "paints", "carries"]
OBJECTS = ["an apple", "the river", "a small house", "the red ball", "some bread", "a green boat"]


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
    """~400 short sentences in ~80 documents: one sentence per line, blank lines between documents."""
    rng = random.Random(0)
    lines = []
    for _ in range(80):
        lines += [f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} ." for _ in range(rng.randint(3, 7))]
        lines.append("")
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def tokenizer(corpus_file):
    """A word-level tokenizer with ALBERT's special tokens, trained on the corpus."""
    model = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    model.pre_tokenizer = pre_tokenizers.Whitespace()
    model.train([str(corpus_file)], trainers.WordLevelTrainer(special_tokens=SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(tokenizer_object=model, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]")


@pytest.fixture(scope="session")
def tiny_config():
    """``tiny_config(training={...})``: a run config for a ~10k-parameter ALBERT on 32-token
    examples from uploaded files, with sections overridden field by field."""
    return _tiny_config


def _tiny_config(**sections) -> RunConfig:
    data = dict(
        model=dict(preset="custom", hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                   embedding_size=16, max_position_embeddings=64),
        data=dict(source="files", max_seq_length=32, shuffle_buffer=50),
        training=dict(target_batch_size=32, per_device_batch_size=4, learning_rate=0.5, warmup_steps=0,
                      total_steps=1000),
        averaging=dict(matchmaking_time=1.0, averaging_timeout=5.0),
    )
    for section, fields in sections.items():
        data[section] = {**data.get(section, {}), **fields}
    return RunConfig.model_validate(data)


@pytest.fixture
def make_trainer(tiny_config, tokenizer, corpus_file):
    """``make_trainer(seed, joins=other_trainer, client_mode=..., averaging={...}, training={...})``; every trainer is
    shut down after the test."""
    trainers = []

    def make(seed, *, joins=None, client_mode=False, averaging=None, training=None):
        setup = TrainerSetup(
            # A wider matchmaking window than the default test config: on 2 busy cores a peer can
            # miss a 1 s window, and a round averaged alone leaves the peers apart for good.
            config=tiny_config(averaging={"matchmaking_time": 2.0, "averaging_timeout": 10.0, **(averaging or {})},
                               training=training or {}),
            run_id="test_run", client_mode=client_mode,
            initial_peers=[str(addr) for addr in joins.dht.get_visible_maddrs()] if joins else [],
            private_key=RSAPrivateKey(), host_maddrs=["/ip4/127.0.0.1/tcp/0"], threads=1, seed=seed,
            data_files=[str(corpus_file)], progress_refresh_s=1.0, bandwidth=100.0)
        trainers.append(Trainer(setup, tokenizer))
        return trainers[-1]

    yield make
    for trainer in trainers:
        trainer.shutdown()
