"""Reads of checkpoint evaluations: the run page's chart and table, the API and the stats dump."""

from __future__ import annotations

from runs.models import Evaluation, Run

# The baselines each run is scored against, in the order the run page lists them (rows, and the
# columns that say whether a checkpoint beats each): the model before training, then models that
# know only how common words and word pairs are. The evaluation of the random-init model measures
# all of them in one child process (runs/evaluation/runner.py).
BASELINE_KINDS = [Evaluation.Kind.RANDOM_INIT, Evaluation.Kind.UNIGRAM, Evaluation.Kind.BIGRAM]


def evaluation_status(evaluation: Evaluation) -> str:
    if evaluation.error:
        return "failed"
    return "pending" if evaluation.mlm_accuracy is None else "done"


def evaluations_of(*, run: Run) -> list[Evaluation]:
    """The run's evaluations, the baselines first (random init, unigram, bigram), then by epoch."""
    def order(e: Evaluation) -> tuple:
        return (0, BASELINE_KINDS.index(e.kind)) if e.baseline else (1, e.epoch)

    return sorted(run.evaluations.all(), key=order)


def evaluation_beats(*, evaluation: Evaluation, baseline: Evaluation | None) -> bool | None:
    """Whether a checkpoint's held-out scores beat a baseline's: a lower perplexity and a higher
    masked-LM accuracy, both. None while either is unmeasured. A model that has learnt only how common
    pieces are matches the unigram's accuracy (it always guesses the commonest piece, measured in
    docs/benchmarks.md section 14) while its perplexity may already be lower: that is not yet beating it."""
    if baseline is None or evaluation_status(baseline) != "done" or evaluation_status(evaluation) != "done":
        return None
    return evaluation.perplexity < baseline.perplexity and evaluation.mlm_accuracy > baseline.mlm_accuracy


def evaluation_row(evaluation: Evaluation) -> dict:
    """One evaluation as the API and the stats dump write it."""
    return {
        "epoch": evaluation.epoch,
        "baseline": evaluation.baseline,
        "kind": evaluation.kind,
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


def evaluation_table(*, run: Run) -> list[dict]:
    """The run page's rows: each evaluation, and for a checkpoint whether it beats each baseline
    (``beats``: per baseline of BASELINE_KINDS, in order, True, False or None while unmeasured)."""
    evaluations = evaluations_of(run=run)
    baselines = {e.kind: e for e in evaluations if e.baseline}
    return [{"evaluation": e, "status": evaluation_status(e),
             "mlm_percent": None if e.mlm_accuracy is None else e.mlm_accuracy * 100,
             "sop_percent": None if e.sop_accuracy is None else e.sop_accuracy * 100,
             "beats": [] if e.baseline else [evaluation_beats(evaluation=e, baseline=baselines.get(kind))
                                             for kind in BASELINE_KINDS]}
            for e in evaluations]
