"""The workload the benchmarks train: a synthetic Bengali/English corpus, a Unigram tokenizer trained
on it, a small ALBERT run config, deterministic masked-LM + SOP batches, and loopback peers.

Everything is generated locally (no hub downloads) from seeds, so two runs see the same data.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from hivemind.utils.crypto import RSAPrivateKey
from transformers import PreTrainedTokenizerFast

from peer_agent.data import batches, dataset_stream
from peer_agent.model import model_build
from peer_agent.protocol import RunConfig, config_from_preset
from peer_agent.tokenizer import tokenizer_as_transformers
from peer_agent.training import TrainerSetup
from runs.setup.corpus import corpus_lines, corpus_write
from runs.setup.tokenization import tokenizer_train

# A ~57k-parameter ALBERT (at the corpus's 379-token vocabulary): a global step of 64 samples
# costs well under a second on one CPU core, so dozens of swarm steps fit in a few minutes.
SMALL_MODEL = dict(preset="custom", hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                   embedding_size=32, max_position_embeddings=64)


@dataclass(frozen=True)
class Workload:
    """What a benchmark trains on: the run's config, its tokenizer, and training/held-out text files."""

    config: RunConfig
    tokenizer: PreTrainedTokenizerFast
    corpus: Path
    held_out_corpus: Path

    def model(self, run_id: str) -> torch.nn.Module:
        """A fresh model with the initial weights a :class:`~peer_agent.training.Trainer` of ``run_id`` draws."""
        return model_build(self.config, len(self.tokenizer), pad_token_id=self.tokenizer.pad_token_id,
                           init_seed=zlib.crc32(run_id.encode()))

    def batch_stream(self, seed: int, batch_size: int | None = None, *, held_out: bool = False) -> Iterator[dict]:
        """Masked-LM + SOP batches of the training (or held-out) text, the same sequence for the same seed."""
        files = [str(self.held_out_corpus if held_out else self.corpus)]
        stream = dataset_stream(self.config, data_files=files, seed=seed)
        size = batch_size or self.config.training.per_device_batch_size
        return batches(self.tokenizer, self.config, stream, size, seed=seed)

    def trainer_setup(self, run_id: str, *, seed: int, joins: Any = None, threads: int = 1) -> TrainerSetup:
        """A loopback peer's setup; ``joins`` is a running Trainer to bootstrap from."""
        return TrainerSetup(
            config=self.config, run_id=run_id, private_key=RSAPrivateKey(), host_maddrs=["/ip4/127.0.0.1/tcp/0"],
            initial_peers=[str(addr) for addr in joins.dht.get_visible_maddrs()] if joins else [],
            threads=threads, seed=seed, data_files=[str(self.corpus)], progress_refresh_s=1.0, bandwidth=100.0)


def workload_build(folder: Path, *, model: dict | None = None, seq_length: int = 64, target_batch_size: int = 64,
                   per_device_batch_size: int = 8, learning_rate: float = 0.01, warmup_steps: int = 5,
                   total_steps: int = 1000, compression: str = "none", matchmaking_time: float = 1.0,
                   averaging_timeout: float = 10.0, aggregation: str = "mean", corpus_lines_count: int = 4000,
                   corpus_seed: int = 0, delay_updates: bool = False) -> Workload:
    """Write the corpora into ``folder``, train the tokenizer and assemble the run config; ``aggregation``
    is how each part of the gradient all-reduce is combined (peer_agent/aggregation.py), ``delay_updates``
    the organizer's delayed parameter updates."""
    folder.mkdir(parents=True, exist_ok=True)
    corpus = corpus_write(folder / "train.txt", n_lines=corpus_lines_count, seed=corpus_seed)
    held_out = corpus_write(folder / "held_out.txt", n_lines=1000, seed=corpus_seed + 1)
    tokenizer = tokenizer_as_transformers(
        tokenizer_train(lines=corpus_lines(n_lines=corpus_lines_count, seed=corpus_seed), vocab_size=1000))
    model = model or SMALL_MODEL
    config = config_from_preset(
        model["preset"], model=model,
        data=dict(source="files", hub=[], max_seq_length=seq_length, shuffle_buffer=1000),
        training=dict(target_batch_size=target_batch_size, per_device_batch_size=per_device_batch_size,
                      learning_rate=learning_rate, warmup_steps=warmup_steps, total_steps=total_steps, precision="fp32"),
        averaging=dict(matchmaking_time=matchmaking_time, averaging_timeout=averaging_timeout,
                       grad_compression=compression, state_compression=compression, aggregation=aggregation,
                       delay_updates=delay_updates))
    return Workload(config=config, tokenizer=tokenizer, corpus=corpus, held_out_corpus=held_out)


def dropout_off(model: torch.nn.Module) -> torch.nn.Module:
    """Switch off ``model``'s dropout (in ALBERT only the sentence-order head has any, p=0.1), making a
    training step a function of the parameters and the batch alone."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return model


