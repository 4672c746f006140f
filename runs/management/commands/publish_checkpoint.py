"""`manage.py publish_checkpoint SLUG EPOCH --to DIR [--hub REPO]`: write a run's checkpoint as a
model directory with its model card, and upload it to the Hugging Face Hub (runs/swarm/release.py)."""

from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from runs.models import Checkpoint
from runs.swarm.release import ReleaseError, checkpoint_publish, checkpoint_upload


class Command(BaseCommand):
    help = ("Write the checkpoint of a run's epoch as a directory transformers' from_pretrained loads, with its "
            "model card (README.md); with --hub, upload it to that Hugging Face repository using HF_TOKEN.")

    def add_arguments(self, parser) -> None:
        parser.add_argument("slug", help="the run's address")
        parser.add_argument("epoch", type=int, help="the checkpoint's collaboration epoch")
        parser.add_argument("--to", required=True, type=Path, metavar="DIR", help="a new or empty directory")
        parser.add_argument("--hub", metavar="REPO", help="also upload to this Hub repository, e.g. org/model-name")
        parser.add_argument("--private", action="store_true", help="create the Hub repository private")

    def handle(self, *args, slug: str, epoch: int, to: Path, hub: str | None = None, private: bool = False,
               **options) -> None:
        checkpoint = Checkpoint.objects.filter(run__slug=slug, epoch=epoch).select_related("run").first()
        if checkpoint is None:
            epochs = list(Checkpoint.objects.filter(run__slug=slug).values_list("epoch", flat=True))
            raise CommandError(f"run {slug!r} has no checkpoint of epoch {epoch}"
                               + (f"; its checkpoints: {', '.join(map(str, sorted(epochs)))}" if epochs else ""))
        if hub and not settings.HF_TOKEN:  # before writing anything
            raise CommandError("set HF_TOKEN (or HF_TOKEN_FILE) to a Hugging Face token with write access to upload")
        try:
            directory = checkpoint_publish(checkpoint=checkpoint, directory=to)
            self.stdout.write(f"Wrote epoch {epoch} of {slug} with its model card to {directory}")
            if hub:
                url = checkpoint_upload(directory=directory, repo_id=hub, private=private)
                self.stdout.write(f"Uploaded to {hub}: {url}")
        except ReleaseError as exc:
            raise CommandError(str(exc)) from None
