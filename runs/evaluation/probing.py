"""Downstream probes: fine-tune a checkpoint on a probe's train part with a fixed small budget and
score it on the test part (seqeval's entity-level F1 for token classification, accuracy for text
classification), the mean over a few seeds with their spread; the same fine-tune from a randomly
initialized model of the same shape, once per probe, is the baseline that shows what pretraining
added. One of the evaluators of runs/evaluation/runner.py: it runs in the evaluation's
low-priority child process, never in the web.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import random
import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from django.db import transaction

from runs.evaluation.subjects import Score, Subject
from runs.models import Checkpoint, Probe, ProbeScore
from runs.setup.probes import LabelledSet, probe_read

if TYPE_CHECKING:
    from transformers import AlbertForPreTraining, PreTrainedTokenizerFast

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProbeBudget:
    """The fixed fine-tune every probe gets, the same for checkpoints and the baseline (docs/organizers.md):
    a linear probe first (the new head alone, on the frozen encoder's features computed once: cheap, and
    it starts the fine-tune from a head that already points the right way), then a short full fine-tune
    (LP-FT). The word embeddings stay frozen in the fine-tune: a probe's test part is about words its
    train part never labels (runs/setup/labelled.py), and moving the train part's words away from the
    rest undoes what pretraining taught about them (measured in docs/benchmarks.md section 15). Dropout
    is off throughout: with so few steps it only adds noise. Measured there too: 1e-4 for the encoder
    left both models at their linear probe's score."""

    linear_steps: int = 300  # full-batch Adam steps of the head on the frozen features
    linear_learning_rate: float = 1e-2
    epochs: int = 3  # of the full fine-tune after the linear probe
    learning_rate: float = 1e-3  # AdamW, constant, for the encoder: a tiny budget has no room for a schedule
    head_learning_rate: float = 1e-2  # for the head, already started by the linear probe
    max_train_examples: int = 1000  # the first ones of the train part
    max_test_examples: int = 500
    batch_size: int = 16
    max_length: int = 64  # tokens per example, longer ones truncated
    seed: int = 0  # the first seed: the head's initial weights and the order of examples
    # Fine-tunes per score, from seeds seed, seed + 1, ...: the score is their mean, reported with
    # their standard deviation, so that a gap between a checkpoint and the baseline can be told from
    # the spread a seed alone makes (docs/benchmarks.md section 15; the cost grows with it).
    seeds: int = 3


BUDGET = ProbeBudget()


@dataclass(frozen=True)
class ProbeResult:
    score: float  # the mean over the budget's seeds
    std: float | None  # their sample standard deviation; None from one seed
    seeds: int
    wall_seconds: float
    cpu_seconds: float


def probe_f1(true: list[list[str]], predicted: list[list[str]]) -> float:
    """Entity-level micro F1 (seqeval, the CoNLL way: an entity counts when its type and span both match)."""
    from seqeval.metrics import f1_score  # loads scikit-learn (seconds): only token-classification probes pay for it

    return float(f1_score(true, predicted))


class _Classifier(torch.nn.Module):
    """A copy of a checkpoint's ALBERT encoder with a new linear head: per token on the last hidden
    states, or per text on their mean over the text's tokens (ALBERT's own pooler is a tanh layer that
    a random-init baseline would start from noise, and that masked-LM pretraining does not train)."""

    def __init__(self, encoder: AlbertForPreTraining, task: str, n_labels: int, seed: int):
        super().__init__()
        self.albert = copy.deepcopy(encoder.albert)
        for module in self.albert.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
        self.albert.embeddings.word_embeddings.weight.requires_grad_(False)  # see ProbeBudget
        self.tokens = task == Probe.Task.TOKENS
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.head = torch.nn.Linear(encoder.config.hidden_size, n_labels)

    def features(self, encoded) -> torch.Tensor:
        states = self.albert(**encoded).last_hidden_state
        if self.tokens:
            return states
        mask = encoded["attention_mask"].unsqueeze(-1).to(states.dtype)
        return (states * mask).sum(1) / mask.sum(1)

    def forward(self, encoded) -> torch.Tensor:
        return self.head(self.features(encoded))


def _token_batch(tokenizer: PreTrainedTokenizerFast, sentences: list, label_ids: dict[str, int], max_length: int):
    """Encode word-split sentences; each word's label sits on its first sub-token, the rest are ignored (-100)."""
    encoded = tokenizer([words for words, _ in sentences], is_split_into_words=True, truncation=True,
                        max_length=max_length, padding=True, return_tensors="pt")
    labels = torch.full(encoded["input_ids"].shape, -100, dtype=torch.long)
    for row, (_, tags) in enumerate(sentences):
        previous = None
        for position, word in enumerate(encoded.word_ids(row)):
            if word is not None and word != previous:
                labels[row, position] = label_ids[tags[word]]
            previous = word
    return encoded, labels


def _text_batch(tokenizer: PreTrainedTokenizerFast, rows: list, label_ids: dict[str, int], max_length: int):
    encoded = tokenizer([text for text, _ in rows], truncation=True, max_length=max_length, padding=True,
                        return_tensors="pt")
    return encoded, torch.tensor([label_ids[label] for _, label in rows])


def _batches(examples: list, size: int):
    for start in range(0, len(examples), size):
        yield examples[start:start + size]


def _loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)


def _linear_probe(model: _Classifier, encode, examples: list, budget: ProbeBudget) -> None:
    """Train the head alone on the frozen encoder's features, computed once (full batch)."""
    model.eval()
    features, targets = [], []
    with torch.no_grad():
        for batch in _batches(examples, budget.batch_size):
            encoded, labels = encode(batch)
            batch_features = model.features(encoded)
            if model.tokens:
                kept = labels != -100
                batch_features, labels = batch_features[kept], labels[kept]
            features.append(batch_features)
            targets.append(labels)
    features, targets = torch.cat(features), torch.cat(targets)
    optimizer = torch.optim.Adam(model.head.parameters(), lr=budget.linear_learning_rate)
    for _ in range(budget.linear_steps):
        loss = _loss(model.head(features), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def _train(model: _Classifier, encode, examples: list, budget: ProbeBudget) -> None:
    _linear_probe(model, encode, examples, budget)
    encoder = [parameter for parameter in model.albert.parameters() if parameter.requires_grad]
    optimizer = torch.optim.AdamW([{"params": encoder, "lr": budget.learning_rate},
                                   {"params": model.head.parameters(), "lr": budget.head_learning_rate}])
    rng = random.Random(budget.seed)
    model.train()
    for _ in range(budget.epochs):
        order = rng.sample(examples, len(examples))
        for batch in _batches(order, budget.batch_size):
            encoded, labels = encode(batch)
            loss = _loss(model(encoded), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


@torch.no_grad()
def _score(model: _Classifier, encode, task: str, examples: list, labels: list[str], budget: ProbeBudget) -> float:
    model.eval()
    true, predicted = [], []
    for batch in _batches(examples, budget.batch_size):
        encoded, targets = encode(batch)
        guesses = model(encoded).argmax(-1)
        if task == Probe.Task.TEXT:
            true += targets.tolist()
            predicted += guesses.tolist()
            continue
        for row, (_, tags) in enumerate(batch):
            # Words cut off by max_length are predicted O, so they count against recall.
            guess = ["O"] * len(tags)
            for position in (targets[row] != -100).nonzero().flatten().tolist():
                guess[encoded.word_ids(row)[position]] = labels[guesses[row, position]]
            true.append(list(tags))
            predicted.append(guess)
    if task == Probe.Task.TOKENS:
        return probe_f1(true, predicted)
    return sum(t == p for t, p in zip(true, predicted, strict=True)) / len(true)


def probe_finetune(*, task: str, train: LabelledSet, test: LabelledSet, labels: list[str],
                   tokenizer: PreTrainedTokenizerFast, encoder: AlbertForPreTraining,
                   budget: ProbeBudget = BUDGET) -> ProbeResult:
    """Fine-tune copies of ``encoder`` (a checkpoint's model, or the run's random initialization) with a
    new head on the train part within ``budget``, once per seed; the mean and spread of their scores on
    the test part, 0 to 1."""
    started, cpu_started = time.monotonic(), time.process_time()
    label_ids = {label: index for index, label in enumerate(labels)}
    batch = _token_batch if task == Probe.Task.TOKENS else _text_batch

    def encode(examples):
        return batch(tokenizer, examples, label_ids, budget.max_length)

    scores = []
    for seed in range(budget.seed, budget.seed + max(budget.seeds, 1)):
        seeded = dataclasses.replace(budget, seed=seed)
        model = _Classifier(encoder, task, len(labels), seed)
        _train(model, encode, train.examples[:budget.max_train_examples], seeded)
        scores.append(_score(model, encode, task, test.examples[:budget.max_test_examples], labels, seeded))
    return ProbeResult(score=statistics.mean(scores), std=statistics.stdev(scores) if len(scores) > 1 else None,
                       seeds=len(scores), wall_seconds=time.monotonic() - started,
                       cpu_seconds=time.process_time() - cpu_started)


def probes_due(checkpoint: Checkpoint) -> bool:
    """Whether the run probes this checkpoint: every ``probe_every``-th one it saved."""
    return checkpoint.number % max(checkpoint.run.probe_every, 1) == 0


def probes_evaluate(subject: Subject) -> list[Score]:
    """The probes' evaluator (runs/evaluation/runner.py): each probe of the run fine-tuned from the
    subject's model, the checkpoint when it is due (all of them by hand, without --save) or the
    random-init baseline; stored when the subject says so."""
    checkpoint = subject.checkpoint
    if subject.save and checkpoint is not None and not probes_due(checkpoint):
        return []
    scores = []
    for probe in subject.run.probes.all():
        train, test = probe_read(probe)
        result = probe_finetune(task=probe.task, train=train, test=test, labels=probe.labels,
                                tokenizer=subject.tokenizer, encoder=subject.model)
        if subject.save:
            _score_store(probe=probe, checkpoint=checkpoint, result=result)
        examples = min(len(test.examples), BUDGET.max_test_examples)
        scores.append(Score(f"probe {probe.name}", probe.metric, result.score, examples, result.cpu_seconds,
                            result.wall_seconds))
    return scores


@transaction.atomic
def _score_store(*, probe: Probe, checkpoint: Checkpoint | None, result: ProbeResult) -> ProbeScore:
    figures = {"score": result.score, "score_std": result.std, "seeds": result.seeds,
               "wall_seconds": result.wall_seconds, "cpu_seconds": result.cpu_seconds}
    if checkpoint is None:
        score, _ = ProbeScore.objects.update_or_create(probe=probe, baseline=True, defaults=figures)
        return score
    # Retention may have deleted the checkpoint while its probes ran (the model was in memory): the
    # score stands, with its epoch and samples, and no link.
    alive = Checkpoint.objects.filter(pk=checkpoint.pk).exists()
    score, _ = ProbeScore.objects.update_or_create(
        probe=probe, baseline=False, epoch=checkpoint.epoch,
        defaults={**figures, "checkpoint": checkpoint if alive else None, "samples": checkpoint.samples})
    return score
