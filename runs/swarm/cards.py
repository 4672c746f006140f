"""A checkpoint's model card: the ``README.md`` in the Hugging Face Hub's format that every checkpoint
zip carries and ``manage.py publish_checkpoint`` publishes. YAML metadata (language, license,
datasets, metrics), then the configuration, how far training had got, the evaluation table and
the volunteers by confirmed credit, named only as each chose to be seen (accounts/models.py)."""

from __future__ import annotations

from pathlib import Path

import yaml
from django.db.models import Q

from peer_agent.protocol import RunConfig
from runs.models import Checkpoint, Evaluation, Probe, ProbeScore, Run, RunCredit

CARD_FILE = "README.md"
CONTRIBUTORS_LISTED = 100  # the card names at most this many; the rest are counted


def card_contributors(run: Run) -> tuple[list[tuple[str, float]], int]:
    """(public name, confirmed credit) of the run's volunteers by credit, and how many more there are:
    those hidden from public boards, and those past the first CONTRIBUTORS_LISTED."""
    credits = RunCredit.objects.filter(run=run, credit__gt=0).select_related("user").order_by("-credit", "user_id")
    named, others = [], 0
    for credit in credits:
        name = credit.user.public_name
        if name is None or len(named) >= CONTRIBUTORS_LISTED:
            others += 1
        else:
            named.append((name, credit.credit))
    return named, others


def _metadata(run: Run, config: RunConfig) -> dict:
    if config.data.source == "hub":
        datasets = [source.path for source in config.data.hub]
    else:
        datasets = [file.name for file in run.data_files.all()]
    metrics = ["f1" if probe.task == Probe.Task.TOKENS else "accuracy" for probe in run.probes.all()]
    metadata = {
        "language": list(run.languages) or None,
        "license": str(run.license),  # a TextChoices member until the row is read back
        "library_name": "transformers",
        "pipeline_tag": "fill-mask",
        "tags": ["albert", "collaborative-training", "hivemind", "dedloc"],
        "datasets": datasets or None,
        "metrics": sorted(set(metrics)) or None,
    }
    return {key: value for key, value in metadata.items() if value is not None}


def _configuration(config: RunConfig) -> list[str]:
    dims, training = config.model.dimensions(), config.training
    return [
        "| | |", "|---|---|",
        f"| model | ALBERT ({config.model.preset}): hidden {dims['hidden_size']}, {dims['num_hidden_layers']} layers "
        f"sharing weights, {dims['num_attention_heads']} heads, embeddings {dims['embedding_size']} |",
        f"| tokenizer | Unigram, {config.tokenizer.vocab_size} tokens |",
        f"| objective | masked LM + sentence order, {config.data.max_seq_length} tokens per example |",
        f"| optimizer | LAMB, learning rate {training.learning_rate}, {training.target_batch_size} samples per step |",
    ]


def _evaluation(run: Run, checkpoint: Checkpoint) -> list[str]:
    rows = []
    for probe in run.probes.all():
        wanted = Q(baseline=True) | Q(baseline=False, epoch=checkpoint.epoch)
        scores = {score.baseline: score for score in ProbeScore.objects.filter(wanted, probe=probe)}
        own, baseline = scores.get(False), scores.get(True)
        rows.append(f"| {probe.name} | {probe.get_task_display()} | {probe.metric} | "
                    f"{'—' if own is None else f'{own.score:.4f}'} | {'—' if baseline is None else f'{baseline.score:.4f}'} |")
    held_out = _held_out(run, checkpoint)
    if not rows:
        return [*held_out, "No downstream probes were measured for this checkpoint."]
    return [*held_out, "Fine-tuned with a fixed small budget on each probe's train part, scored on its test part; the "
            "baseline is the same fine-tune from a randomly initialized model of the same shape.", "",
            "| probe | task | metric | this checkpoint | random-init baseline |", "|---|---|---|---|---|", *rows]


def _held_out(run: Run, checkpoint: Checkpoint) -> list[str]:
    """The held-out evaluation of the checkpoint beside the random-init baseline's (runs/evaluation/)."""
    wanted = Q(epoch=checkpoint.epoch) | Q(kind=Evaluation.Kind.RANDOM_INIT)
    rows = {evaluation.epoch: evaluation for evaluation in Evaluation.objects.filter(wanted, run=run)}
    own, baseline = rows.get(checkpoint.epoch), rows.get(None)

    def figure(evaluation, name: str, percent: bool) -> str:
        value = getattr(evaluation, name, None) if evaluation else None
        return "—" if value is None else (f"{value:.2%}" if percent else f"{value:.1f}")

    if own is None and baseline is None:
        return []
    lines = ["On the run's held-out text, which no volunteer trained on:", "",
             "| metric | this checkpoint | random-init baseline |", "|---|---|---|"]
    for name, label, percent in (("mlm_accuracy", "masked-LM accuracy", True), ("perplexity", "perplexity", False),
                                 ("sop_accuracy", "sentence-order accuracy", True)):
        lines.append(f"| {label} | {figure(own, name, percent)} | {figure(baseline, name, percent)} |")
    return [*lines, ""]


def model_card(*, run: Run, checkpoint: Checkpoint) -> str:
    """The card's text for ``checkpoint`` of ``run``."""
    config = run.configuration
    named, others = card_contributors(run)
    tokens = checkpoint.samples * config.data.max_seq_length
    contributors = [f"- {name}: {credit:,.0f} GFLOP of confirmed credit" for name, credit in named]
    if others:
        contributors.append(f"- and {others} more volunteer{'s' if others != 1 else ''} who chose not to be named here")
    lines = [
        "---", yaml.safe_dump(_metadata(run, config), allow_unicode=True, sort_keys=False).rstrip(), "---", "",
        f"# {run.name}", "", run.description or "", "",
        f"Pretrained collaboratively by volunteers with [hivemind](https://github.com/learning-at-home/hivemind): "
        f"checkpoint of collaboration epoch {checkpoint.epoch}.", "",
        "## Configuration", "", *_configuration(config), "",
        "## Training", "",
        f"- epoch: {checkpoint.epoch}",
        f"- samples seen: {checkpoint.samples:,}",
        f"- tokens seen: {tokens:,} (samples × {config.data.max_seq_length}-token examples, padding included)",
        f"- training loss: {'—' if checkpoint.loss is None else f'{checkpoint.loss:.4f}'}", "",
        "## Evaluation", "", *_evaluation(run, checkpoint), "",
        "## Contributors", "", "By confirmed credit (training compute the run's coordinator verified):", "",
        *(contributors or ["No confirmed credit yet."]), "",
    ]
    return "\n".join(lines)


def model_card_write(*, run: Run, checkpoint: Checkpoint, directory: Path) -> Path:
    path = directory / CARD_FILE
    path.write_text(model_card(run=run, checkpoint=checkpoint), encoding="utf-8")
    return path
