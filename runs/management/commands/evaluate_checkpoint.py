"""`manage.py evaluate_checkpoint SLUG EPOCH [--save]`: evaluate one checkpoint of a run (or
``baseline``: the random-init model and the word-frequency baselines) on its held-out split and
print a table; the Celery task starts this same command as its child process
(runs/evaluation/services.py)."""

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from runs.models import Run


class Command(BaseCommand):
    help = ("Evaluate a run's checkpoint (EPOCH, or 'baseline' for the random-init and word-frequency baselines) on the "
            "run's held-out split with every evaluator and print the scores; --save stores them as the task does.")

    def add_arguments(self, parser) -> None:
        parser.add_argument("slug")
        parser.add_argument("epoch", help="the checkpoint's epoch, or 'baseline'")
        parser.add_argument("--save", action="store_true", help="store the scores (replacing earlier ones)")
        parser.add_argument("--threads", type=int, default=None,
                            help="torch threads (default EVALUATION_THREADS)")
        parser.add_argument("--nice", type=int, default=None, help="priority increment (default EVALUATION_NICE)")

    def handle(self, *args, slug: str, epoch: str, save: bool, threads: int | None, nice: int | None, **options) -> None:
        run = Run.objects.filter(slug=slug).first()
        if run is None:
            raise CommandError(f"there is no run {slug!r}")
        checkpoint = None
        if epoch != "baseline":
            if not epoch.isdigit():
                raise CommandError(f"EPOCH must be a checkpoint's epoch or 'baseline', not {epoch!r}")
            checkpoint = run.checkpoints.filter(epoch=int(epoch)).first()
            if checkpoint is None:
                kept = ", ".join(str(e) for e in run.checkpoints.values_list("epoch", flat=True)) or "none"
                raise CommandError(f"run {slug!r} has no checkpoint of epoch {epoch} (it keeps epochs: {kept})")
        threads = threads or settings.EVALUATION_THREADS
        if threads < 1:
            raise CommandError("--threads must be at least 1")
        from runs.evaluation.runner import EvaluationError, evaluation_run, process_settle  # torch: only here

        process_settle(threads=threads, niceness=settings.EVALUATION_NICE if nice is None else nice)
        try:
            scores = evaluation_run(run, checkpoint, save=save)
        except EvaluationError as exc:
            raise CommandError(str(exc)) from None
        title = "baselines (random init, word frequencies)" if checkpoint is None else f"epoch {checkpoint.epoch}"
        self.stdout.write(f"{run.slug}, {title}, {threads} threads")
        self.stdout.write(f"{'evaluator':<12} {'metric':<14} {'value':>12} {'examples':>9} {'CPU s':>8} {'wall s':>8}")
        for score in scores:
            value = "—" if score.value is None else f"{score.value:.4f}"
            self.stdout.write(f"{score.evaluator:<12} {score.metric:<14} {value:>12} {score.examples:>9} "
                              f"{score.cpu_seconds:>8.2f} {score.wall_seconds:>8.2f}")
