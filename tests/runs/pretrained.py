"""A real checkpoint of a tiny ALBERT pretrained briefly in-process on the generated corpus: what the
probes' and the model card's tests fine-tune, load and publish. No swarm: one process, plain AdamW,
the agents' own masked-LM + sentence-order batches (peer_agent/data.py)."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from peer_agent.checkpoint import CheckpointMetadata, checkpoint_write
from peer_agent.data import batches, dataset_stream
from peer_agent.model import model_build
from peer_agent.tokenizer import tokenizer_as_transformers
from runs.setup.corpus import corpus_lines, corpus_write
from runs.setup.forms import preset_config
from runs.setup.tokenization import tokenizer_train


def tiny_config():
    """The demo's tiny preset on 64-token examples."""
    config = preset_config("tiny")
    config.data.max_seq_length = 64
    config.data.shuffle_buffer = 200
    return config


def pretrain(directory: Path, *, steps: int, n_lines: int = 6000, seed: int = 0, run_id: str = "probe-test") -> Path:
    """Pretrain for ``steps`` batches of 16 and write the checkpoint into ``directory``; 0 steps: the
    random initialization itself."""
    config = tiny_config()
    corpus = corpus_write(directory.parent / f"{directory.name}-corpus.txt", n_lines=n_lines, seed=seed)
    tokenizer = tokenizer_as_transformers(tokenizer_train(lines=corpus_lines(n_lines=n_lines, seed=seed),
                                                          vocab_size=config.tokenizer.vocab_size))
    model = model_build(config, len(tokenizer), pad_token_id=tokenizer.pad_token_id, init_seed=seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    stream = dataset_stream(config, data_files=[str(corpus)], seed=seed)
    model.train()
    loss = None
    for step, batch in enumerate(batches(tokenizer, config, stream, 16, seed=seed)):
        if step >= steps:
            break
        loss = model(**batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    metadata = CheckpointMetadata(run_id=run_id, epoch=max(steps // 50, 1), loss=None if loss is None else float(loss),
                                  samples=steps * 16, time=time.time())
    checkpoint_write(directory, model=model, tokenizer=tokenizer, optimizer_state=optimizer.state_dict(), metadata=metadata)
    return directory
