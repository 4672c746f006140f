"""Reads of checkpoint evaluations: the run page's chart, the API and the stats dump."""

from __future__ import annotations

from runs.models import Evaluation, Run


def evaluation_status(evaluation: Evaluation) -> str:
    if evaluation.error:
        return "failed"
    return "pending" if evaluation.mlm_accuracy is None else "done"


def evaluations_of(*, run: Run) -> list[Evaluation]:
    """The run's evaluations, the baseline first, then by epoch."""
    return list(run.evaluations.all())


def evaluation_row(evaluation: Evaluation) -> dict:
    """One evaluation as the API and the stats dump write it."""
    return {
        "epoch": evaluation.epoch,
        "baseline": evaluation.baseline,
        "status": evaluation_status(evaluation),
        "samples": evaluation.samples,
        "tokens_seen": evaluation.tokens_seen,
        "mlm_accuracy": evaluation.mlm_accuracy,
        "perplexity": evaluation.perplexity,
        "sop_accuracy": evaluation.sop_accuracy,
        "examples": evaluation.examples,
        "masked_tokens": evaluation.masked_tokens,
        "cpu_seconds": evaluation.cpu_seconds,
        "wall_seconds": evaluation.wall_seconds,
        "error": evaluation.error,
        "created_at": evaluation.created_at.isoformat(),
    }
