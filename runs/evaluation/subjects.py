"""What an evaluator is given and what it returns (runs/evaluation/runner.py lists the evaluators;
runs/evaluation/probing.py is one of them)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from peer_agent.protocol import RunConfig
from runs.models import Checkpoint, Run

if TYPE_CHECKING:
    import torch
    from transformers import AlbertForPreTraining, PreTrainedTokenizerFast


@dataclass
class Subject:
    run: Run
    checkpoint: Checkpoint | None  # None: the random-init baseline
    config: RunConfig
    model: AlbertForPreTraining
    tokenizer: PreTrainedTokenizerFast
    save: bool
    batches: list[dict[str, torch.Tensor]] | None = None  # the held-out batches, built once per subject


@dataclass(frozen=True)
class Score:
    evaluator: str
    metric: str
    value: float | None
    examples: int
    cpu_seconds: float
    wall_seconds: float


Evaluator = Callable[[Subject], list[Score]]
