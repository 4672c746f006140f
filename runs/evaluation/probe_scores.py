"""Reads of the downstream probes' scores: the run page's table and the API (light: the web imports it)."""

from __future__ import annotations

from runs.models import Probe, ProbeScore, Run


def probe_score_rows(*, run: Run) -> list[dict]:
    """Per probe of the run: its task and metric, the random-init baseline, every scored epoch (oldest
    first) and the newest score's gain over the baseline (None until both exist); each score is a mean
    over seeds, with its standard deviation."""
    scores: dict[int, list[ProbeScore]] = {}
    for score in ProbeScore.objects.filter(probe__run=run).order_by("epoch"):
        scores.setdefault(score.probe_id, []).append(score)
    rows = []
    for probe in Probe.objects.filter(run=run):
        own = scores.get(probe.pk, [])
        baseline = next((score for score in own if score.baseline), None)
        epochs = [{"epoch": score.epoch, "samples": score.samples, "score": score.score, "std": score.score_std,
                   "seeds": score.seeds, "cpu_seconds": score.cpu_seconds, "wall_seconds": score.wall_seconds}
                  for score in own if not score.baseline]
        latest = epochs[-1] if epochs else None
        rows.append({
            "name": probe.name, "task": probe.task, "metric": probe.metric, "labels": probe.labels,
            "train_examples": probe.train_examples, "test_examples": probe.test_examples,
            "baseline": None if baseline is None else baseline.score,
            "baseline_std": None if baseline is None else baseline.score_std,
            "latest": latest, "scores": epochs,
            "gain": None if latest is None or baseline is None else latest["score"] - baseline.score,
        })
    return rows
