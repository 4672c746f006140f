"""Writes of checkpoint evaluations, and the child process that makes them.

Light: the Celery worker imports this module. The evaluation itself (torch) runs in a child
process, ``manage.py evaluate_checkpoint SLUG EPOCH --save`` (runs/evaluation/runner.py), at low
priority with ``EVALUATION_THREADS`` threads. The Evaluation row is the claim: the task creates it
empty before starting the child, so that a second worker (or a retried task) finds it taken, and
the uniqueness of (run, epoch) guarantees one row per checkpoint whatever happens.
"""

from __future__ import annotations

import datetime
import logging
import os
import subprocess
import sys
import tempfile
import time

from celery.worker import state
from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from runs.evaluation.selectors import BASELINE_KINDS
from runs.models import Checkpoint, Evaluation, Run

logger = logging.getLogger(__name__)

# Evaluations one task makes at most: the worker's other tasks wait meanwhile.
PER_TASK = 2


def evaluation_record(*, run: Run, checkpoint: Checkpoint | None, kind: str, mlm_accuracy: float, perplexity: float,
                      sop_accuracy: float | None, examples: int, masked_tokens: int, cpu_seconds: float,
                      wall_seconds: float, tokens_per_sample: int) -> Evaluation:
    """Store the held-out scores of ``checkpoint``, or (None) of the baseline of ``kind``, over its claim if any."""
    samples = checkpoint.samples if checkpoint else 0
    # Retention may have deleted the checkpoint while it was evaluated: its scores stay, unlinked.
    kept = checkpoint if checkpoint and Checkpoint.objects.filter(pk=checkpoint.pk).exists() else None
    evaluation, _ = Evaluation.objects.update_or_create(
        run=run, epoch=checkpoint.epoch if checkpoint else None, kind=kind,
        defaults=dict(checkpoint=kept, samples=samples, tokens_seen=samples * tokens_per_sample,
                      mlm_accuracy=mlm_accuracy, perplexity=perplexity, sop_accuracy=sop_accuracy, examples=examples,
                      masked_tokens=masked_tokens, cpu_seconds=cpu_seconds, wall_seconds=wall_seconds, error=""),
    )
    return evaluation


def baseline_fail(*, run: Run, kind: str, error: str) -> Evaluation:
    """Store why the baseline of ``kind`` could not be measured: it shows as failed, and is not retried."""
    evaluation, _ = Evaluation.objects.update_or_create(
        run=run, epoch=None, kind=kind, defaults=dict(mlm_accuracy=None, perplexity=None, error=error[:2000]))
    return evaluation


def _baselines_missing(run: Run) -> list[str]:
    kept = set(run.evaluations.filter(epoch=None).values_list("kind", flat=True))
    return [kind for kind in BASELINE_KINDS if kind not in kept]


def evaluations_due() -> list[tuple[Run, Checkpoint | None]]:
    """What no evaluation covers yet, per run with checkpoints: its baselines (None: a run made before
    one of them existed gets them all measured again), then its checkpoints newest first (the run
    page shows where training is now; a backlog fills in behind)."""
    due: list[tuple[Run, Checkpoint | None]] = []
    runs = Run.objects.filter(checkpoints__isnull=False, tokenizer_status=Run.TokenizerStatus.READY).distinct()
    for run in runs:
        if _baselines_missing(run):
            due.append((run, None))
        epochs = run.evaluations.exclude(epoch=None).values_list("epoch", flat=True)
        due += [(run, checkpoint) for checkpoint in run.checkpoints.exclude(epoch__in=list(epochs))]
    return due


def evaluation_claim(*, run: Run, checkpoint: Checkpoint | None) -> Evaluation | None:
    """An empty Evaluation row for ``checkpoint`` (None: the first baseline the run lacks), or None
    when another claim or result holds it."""
    kind = Evaluation.Kind.CHECKPOINT
    if checkpoint is None:
        missing = _baselines_missing(run)
        if not missing:
            return None
        kind = missing[0]
    try:
        with transaction.atomic():
            return Evaluation.objects.create(run=run, checkpoint=checkpoint, kind=kind,
                                             epoch=checkpoint.epoch if checkpoint else None,
                                             samples=checkpoint.samples if checkpoint else 0)
    except IntegrityError:
        return None


def claims_expire(*, now: datetime.datetime) -> int:
    """Forget claims older than an evaluation may take (their worker died): they are due again."""
    stale = now - datetime.timedelta(seconds=settings.EVALUATION_TIMEOUT_SECONDS + 60)
    deleted, _ = Evaluation.objects.filter(mlm_accuracy=None, error="", created_at__lt=stale).delete()
    return deleted


def evaluation_command(evaluation: Evaluation) -> list[str]:
    epoch = "baseline" if evaluation.epoch is None else str(evaluation.epoch)
    return [sys.executable, str(settings.BASE_DIR / "manage.py"), "evaluate_checkpoint", evaluation.run.slug, epoch,
            "--save", "--threads", str(settings.EVALUATION_THREADS), "--nice", str(settings.EVALUATION_NICE)]


def _worker_stopping() -> bool:
    # As celery.worker.state.maybe_shutdown reads them: a warm shutdown sets should_stop to EX_OK, 0.
    return any(flag is not None and flag is not False for flag in (state.should_stop, state.should_terminate))


def _child_run(command: list[str], env: dict) -> tuple[int | None, str]:
    """Run the evaluating child; (its exit status, or None when it was stopped, and its stderr).
    It is stopped past EVALUATION_TIMEOUT_SECONDS, or as soon as the worker is asked to stop (a warm
    shutdown would otherwise wait out the whole evaluation)."""
    deadline = time.monotonic() + settings.EVALUATION_TIMEOUT_SECONDS
    with tempfile.TemporaryFile(mode="w+") as stderr:
        child = subprocess.Popen(command, env=env, cwd=settings.BASE_DIR, stdout=subprocess.DEVNULL, stderr=stderr, text=True)
        while True:
            try:
                status = child.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                if _worker_stopping() or time.monotonic() > deadline:
                    child.kill()
                    child.wait()
                    status = None
                    break
        stderr.seek(0)
        return status, stderr.read()


def evaluation_perform(evaluation: Evaluation) -> bool:
    """Evaluate a claimed row in a child process; a failure is stored on the row (not retried)."""
    # OpenMP reads its thread count when torch loads, before the child could bound it itself.
    env = {**os.environ, "OMP_NUM_THREADS": str(settings.EVALUATION_THREADS)}
    status, stderr = _child_run(evaluation_command(evaluation), env)
    if status == 0:
        return True
    gone = evaluation.epoch is not None and not Checkpoint.objects.filter(run=evaluation.run, epoch=evaluation.epoch).exists()
    if gone or (status is None and _worker_stopping()):
        # Retention deleted the checkpoint meanwhile (nothing is left to evaluate, nor a failure to
        # show), or the worker is stopping: the claim goes, and the next worker takes it up again.
        Evaluation.objects.filter(pk=evaluation.pk, mlm_accuracy=None).delete()
        return False
    if status is None:
        detail = f"the evaluation took longer than EVALUATION_TIMEOUT_SECONDS ({settings.EVALUATION_TIMEOUT_SECONDS} s)"
    else:
        lines = [line for line in stderr.splitlines() if line.strip()]
        detail = lines[-1] if lines else f"the evaluating process exited with status {status}"
        logger.warning("evaluation of %s epoch %s failed:\n%s", evaluation.run.slug, evaluation.epoch, stderr[-4000:])
    Evaluation.objects.filter(pk=evaluation.pk, mlm_accuracy=None).update(error=detail[:2000])
    return False


def evaluations_pending(*, limit: int = PER_TASK) -> int:
    """Evaluate up to ``limit`` checkpoints (or baselines) that have none yet; returns how many were made."""
    claims_expire(now=timezone.now())
    made = 0
    for run, checkpoint in evaluations_due():
        if made >= limit or _worker_stopping():
            break
        evaluation = evaluation_claim(run=run, checkpoint=checkpoint)
        if evaluation is not None:
            made += evaluation_perform(evaluation)
    return made
