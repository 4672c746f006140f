"""A small ALBERT, its pretraining in one process and its loss, as the evaluation tests train their checkpoints
(tests/runs/evaluation_world.py) and bench/heldout_spread.py measures their spread over seeds."""

from __future__ import annotations

import copy

import torch

from peer_agent.data import batches, dataset_stream
from peer_agent.model import model_build
from peer_agent.protocol import RunConfig


def small_config() -> dict:
    from runs.setup.forms import preset_config  # needs Django, which loss_evaluate's users (bench/swarm_spread.py) do not

    config = preset_config("tiny").model_dump(mode="json")
    config["model"] = dict(preset="custom", hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=128, embedding_size=32, max_position_embeddings=64)
    config["tokenizer"]["vocab_size"] = 400
    config["data"].update(max_seq_length=64, shuffle_buffer=100)
    return config


def model_pretrain(config: RunConfig, tokenizer, files: list[str], *, init_seed: int, steps: int, batch_size: int = 16):
    """The run's model trained from ``init_seed`` for ``steps`` AdamW steps on ``files``, in the data order
    of seed 1: the same weights for the same arguments (ALBERT's dropout is off, peer_agent/model.py)."""
    model = model_build(config, len(tokenizer), pad_token_id=tokenizer.pad_token_id, init_seed=init_seed)
    stream = dataset_stream(config, data_files=files, seed=1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _, batch in zip(range(steps), batches(tokenizer, config, stream, batch_size, seed=1), strict=False):
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model


def loss_evaluate(model, batch: dict) -> float:
    """The pretraining loss (masked-LM + sentence order) of ``model`` on ``batch``, in eval mode.

    Computed in float64 on a copy, so that parameter differences smaller than float32's resolution
    of the loss (~5e-7 near 6.6) still show; ``model`` itself is left as it is.
    """
    evaluated = copy.deepcopy(model).double().eval()
    with torch.no_grad():
        return evaluated(**batch).loss.item()
