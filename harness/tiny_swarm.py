"""A tiny run for real hivemind peers on loopback: a small corpus, a tokenizer trained on it, a ~10k-parameter
ALBERT's run config and its trainers, as the agent's swarm tests (tests/peer_agent/conftest.py) and
bench/swarm_spread.py make them."""

from __future__ import annotations

import random
from pathlib import Path

from peer_agent.protocol import SPECIAL_TOKENS, RunConfig

SUBJECTS = ["the cat", "a dog", "my friend", "the teacher", "our neighbour", "the farmer"]
VERBS = ["eats", "sees", "likes", "finds", "paints", "carries"]
OBJECTS = ["an apple", "the river", "a small house", "the red ball", "some bread", "a green boat"]


def corpus_write(path: Path) -> Path:
    """~400 short sentences in ~80 documents at ``path``: one sentence per line, blank lines between documents."""
    rng = random.Random(0)
    lines = []
    for _ in range(80):
        lines += [f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} ." for _ in range(rng.randint(3, 7))]
        lines.append("")
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def tokenizer_train(corpus: Path):
    """A word-level tokenizer with ALBERT's special tokens, trained on ``corpus``."""
    # tests/peer_agent/conftest.py imports this module: the agent's light tests never load transformers or hivemind
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    model = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    model.pre_tokenizer = pre_tokenizers.Whitespace()
    model.train([str(corpus)], trainers.WordLevelTrainer(special_tokens=SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(tokenizer_object=model, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]")


def tiny_config(**sections) -> RunConfig:
    """A run config for a ~10k-parameter ALBERT on 32-token examples from uploaded files, with sections
    overridden field by field (``tiny_config(training={...})``)."""
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


def trainer_make(tokenizer, corpus: Path, seed: int, *, joins=None, client_mode=False, averaging=None, training=None):
    """A real ``Trainer`` of the tiny run on loopback with data seed ``seed``, joining ``joins``' swarm if given."""
    # tests/peer_agent/conftest.py imports this module: the agent's light tests never load transformers or hivemind
    from hivemind.utils.crypto import RSAPrivateKey

    from peer_agent.training import Trainer, TrainerSetup

    setup = TrainerSetup(
        # A wider matchmaking window than tiny_config's: on 2 busy cores a peer can miss a 1 s window,
        # and a round averaged alone leaves the peers apart for good.
        config=tiny_config(averaging={"matchmaking_time": 2.0, "averaging_timeout": 10.0, **(averaging or {})},
                           training=training or {}),
        run_id="test_run", client_mode=client_mode,
        initial_peers=[str(addr) for addr in joins.dht.get_visible_maddrs()] if joins else [],
        private_key=RSAPrivateKey(), host_maddrs=["/ip4/127.0.0.1/tcp/0"], threads=1, seed=seed,
        data_files=[str(corpus)], progress_refresh_s=1.0, bandwidth=100.0)
    return Trainer(setup, tokenizer)
