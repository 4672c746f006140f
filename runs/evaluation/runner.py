"""Evaluation of one checkpoint (or of the random-init baseline) on the run's held-out split.

Heavy (torch, transformers): only the evaluating process imports this module, the
``evaluate_checkpoint`` command, which the Celery task starts as a child process
(runs/evaluation/services.py); never the web or the worker (docs/design.md, "What may import what").
It runs on CPUs, at low priority, with a bounded thread count (:func:`process_settle`).

Evaluators. What is measured of a checkpoint is the list :data:`EVALUATORS`. An evaluator is a
callable ``evaluator(subject: Subject) -> list[Score]``: it reads the loaded model and tokenizer,
the run, its config and the checkpoint (``None``: the random-init baseline, the same shape with
the weights the run started from), stores what it measured when ``subject.save`` is true (as an
update-or-create, since an evaluation may be retried), and returns rows for the printed table.
:func:`heldout_evaluate` is the first; :func:`frequencies_evaluate` scores the word-frequency
baselines with the random-init one; a downstream probe is one more entry in the list.
"""

from __future__ import annotations

import logging
import math
import os
import random
import tempfile
import time
import zlib
from collections.abc import Iterable
from pathlib import Path

import torch
from transformers import AlbertForPreTraining, DataCollatorForLanguageModeling, PreTrainedTokenizerFast

from peer_agent.checkpoint import checkpoint_unzip
from peer_agent.data import example_encode, sentence_pairs, sentences_split
from peer_agent.model import model_build
from peer_agent.protocol import RunConfig
from peer_agent.sources import hub_documents
from peer_agent.tokenizer import tokenizer_load
from runs.evaluation import services
from runs.evaluation.frequencies import frequencies_count, frequency_metrics
from runs.evaluation.probing import probes_evaluate
from runs.evaluation.subjects import Evaluator, Score, Subject
from runs.models import Checkpoint, Evaluation, Run
from runs.setup.heldout import heldout_documents_read
from runs.setup.services import data_sample

logger = logging.getLogger(__name__)

BATCH_SIZE = 16
FREQUENCY_KINDS = {"unigram": Evaluation.Kind.UNIGRAM, "bigram": Evaluation.Kind.BIGRAM}
# The same pairs and masks for every checkpoint of a run, so that their scores compare.
SEED = 0


class EvaluationError(Exception):
    """An evaluation that cannot be made; the message says why, for the run's organizers."""


def process_settle(*, threads: int, niceness: int) -> None:
    """Lower this process's priority and bound torch's threads: a host that also runs a backbone
    peer or the web keeps serving them while an evaluation runs."""
    if niceness:
        os.nice(niceness)
    torch.set_num_threads(threads)


def heldout_texts(run: Run, config: RunConfig) -> list[str]:
    """The held-out documents: the portal's split of the uploaded files; for hub sources, the first
    ``run.heldout_size`` documents that ``DataConfig.holds_out`` keeps from the agents, or of the
    sources' validation split (``run.validation_split``), mixed as the agents' training data is."""
    if config.data.source == "files":
        if not run.heldout_file:
            raise EvaluationError("the run keeps no held-out documents: its files were too small to spare any "
                                  "(a file gives at most a quarter of its documents), or were uploaded before "
                                  "held-out splits existed; upload more text")
        with run.heldout_file.open("rb") as handle:
            return heldout_documents_read(handle.read().decode("utf-8"))
    data = config.data
    if data.heldout == "hash":
        stream = hub_documents(data, seed=SEED).filter(lambda row: data.holds_out(row["text"] or ""))
    else:
        stream = hub_documents(data, seed=SEED, split=run.validation_split)
    documents: dict[str, None] = {}  # a mixture comes back round to its smaller sources: each document once
    for row in stream:
        documents[row["text"] or ""] = None
        if len(documents) >= run.heldout_size:
            break
    return list(documents)


def heldout_batches(tokenizer: PreTrainedTokenizerFast, config: RunConfig,
                    documents: Iterable[str]) -> list[dict[str, torch.Tensor]]:
    """Masked-LM + SOP batches of the held-out documents, built and masked as the agents build
    theirs (peer_agent/data.py), from a fixed seed and in document order: the same for every
    checkpoint. Unlike training, the last partial batch counts too."""
    rng = random.Random(SEED)
    examples = []
    for document in documents:
        sentences = sentences_split(document)
        segments = [ids for ids in tokenizer(sentences, add_special_tokens=False)["input_ids"] if ids] if sentences else []
        for pair in sentence_pairs(segments, config.data.max_seq_length - 3, config.data.short_seq_probability, rng):
            examples.append(example_encode(pair, tokenizer, config.data.max_seq_length))
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=config.data.mlm_probability)
    collator.generator = torch.Generator().manual_seed(SEED)
    batches = []
    for start in range(0, len(examples), BATCH_SIZE):
        chunk = examples[start:start + BATCH_SIZE]
        batch = {key: torch.tensor([example[key] for example in chunk])
                 for key in ("input_ids", "token_type_ids", "attention_mask", "special_tokens_mask", "sentence_order_label")}
        batch["input_ids"], batch["labels"] = collator.torch_mask_tokens(
            batch["input_ids"], special_tokens_mask=batch.pop("special_tokens_mask"))
        batches.append(batch)
    return batches


@torch.no_grad()
def heldout_metrics(model: AlbertForPreTraining, batches: list[dict[str, torch.Tensor]]) -> dict:
    """Masked-LM accuracy and perplexity (over masked tokens) and sentence-order accuracy."""
    model.eval()
    masked = correct = sop_correct = examples = 0
    loss_sum = 0.0
    for batch in batches:
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    token_type_ids=batch["token_type_ids"])
        where = batch["labels"] != -100
        logits, labels = out.prediction_logits[where], batch["labels"][where]
        loss_sum += torch.nn.functional.cross_entropy(logits, labels, reduction="sum").item()
        correct += int((logits.argmax(-1) == labels).sum())
        masked += int(where.sum())
        sop_correct += int((out.sop_logits.argmax(-1) == batch["sentence_order_label"]).sum())
        examples += len(batch["input_ids"])
    if not examples or not masked:
        raise EvaluationError("the held-out documents hold no usable text: every one was empty or too short")
    return dict(mlm_accuracy=correct / masked, perplexity=math.exp(min(loss_sum / masked, 700.0)),
                sop_accuracy=sop_correct / examples, examples=examples, masked_tokens=masked)


def subject_batches(subject: Subject) -> list[dict[str, torch.Tensor]]:
    """The held-out batches of the subject's run, read (or streamed from the hub) once for all evaluators."""
    if subject.batches is None:
        subject.batches = heldout_batches(subject.tokenizer, subject.config, heldout_texts(subject.run, subject.config))
    return subject.batches


def heldout_evaluate(subject: Subject) -> list[Score]:
    """The held-out evaluator: masked-LM accuracy, perplexity and sentence-order accuracy."""
    cpu, wall = time.process_time(), time.perf_counter()
    metrics = heldout_metrics(subject.model, subject_batches(subject))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    if subject.save:
        kind = Evaluation.Kind.RANDOM_INIT if subject.checkpoint is None else Evaluation.Kind.CHECKPOINT
        services.evaluation_record(run=subject.run, checkpoint=subject.checkpoint, kind=kind, cpu_seconds=cpu,
                                   wall_seconds=wall, tokens_per_sample=subject.config.data.max_seq_length, **metrics)
    return [Score("held-out", name, metrics[name], metrics["examples"], cpu, wall)
            for name in ("mlm_accuracy", "perplexity", "sop_accuracy")]


def frequencies_evaluate(subject: Subject) -> list[Score]:
    """The word-frequency baselines (runs/evaluation/frequencies.py), measured with the random-init
    one: they depend on the run's data, never on a checkpoint. When they cannot be measured (no words
    in the training text, a hub dataset's training split out of reach) the reason is stored on their
    rows and the other evaluators go on: the probes' baseline must not wait on them."""
    if subject.checkpoint is not None:
        return []
    cpu, wall = time.process_time(), time.perf_counter()
    try:
        training = data_sample(run=subject.run, limit=subject.config.tokenizer.sample_size)
        measured = frequency_metrics(counts=frequencies_count(tokenizer=subject.tokenizer, documents=training),
                                     batches=subject_batches(subject))
    except EvaluationError:
        raise  # the held-out split itself is unusable: the held-out evaluator has said so already
    except Exception as exc:
        reason = f"the word-frequency baselines could not be measured: {exc}"
        if not subject.save:
            raise EvaluationError(reason) from exc
        logger.warning("word-frequency baselines of %s failed", subject.run.slug, exc_info=True)
        for kind in FREQUENCY_KINDS.values():
            services.baseline_fail(run=subject.run, kind=kind, error=reason)
        return []
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    scores = []
    for model, kind in FREQUENCY_KINDS.items():
        metrics = measured[model]
        if subject.save:
            services.evaluation_record(run=subject.run, checkpoint=None, kind=kind, sop_accuracy=None, cpu_seconds=cpu,
                                       wall_seconds=wall, tokens_per_sample=subject.config.data.max_seq_length,
                                       **metrics)
        scores += [Score(model, name, metrics[name], metrics["examples"], cpu, wall)
                   for name in ("mlm_accuracy", "perplexity")]
    return scores

EVALUATORS: list[Evaluator] = [heldout_evaluate, frequencies_evaluate, probes_evaluate]


def subject_load(run: Run, checkpoint: Checkpoint | None, workdir: Path, *, save: bool) -> Subject:
    """The run's model at ``checkpoint`` (unzipped into ``workdir``), or freshly initialized as the
    run's peers started it, with the run's tokenizer."""
    if run.tokenizer_status != Run.TokenizerStatus.READY:
        raise EvaluationError("the run has no tokenizer yet")
    config = run.configuration
    tokenizer = tokenizer_load(Path(run.tokenizer_file.path))
    if checkpoint is None:
        model = model_build(config, len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                            init_seed=zlib.crc32(run.hivemind_run_id.encode()))
    else:
        model = AlbertForPreTraining.from_pretrained(checkpoint_unzip(Path(checkpoint.file.path), workdir))
    return Subject(run=run, checkpoint=checkpoint, config=config, model=model.eval(), tokenizer=tokenizer, save=save)


def evaluation_run(run: Run, checkpoint: Checkpoint | None, *, save: bool,
                   evaluators: list[Evaluator] | None = None) -> list[Score]:
    """Every evaluator's scores of ``checkpoint`` (None: the baseline), stored when ``save``."""
    with tempfile.TemporaryDirectory(prefix="evaluation-") as workdir:
        subject = subject_load(run, checkpoint, Path(workdir), save=save)
        return [score for evaluator in (EVALUATORS if evaluators is None else evaluators) for score in evaluator(subject)]
