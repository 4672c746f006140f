"""`manage.py hosted_notebook`: write notebooks/join-a-run.ipynb, the join notebook for any run that a hosted
notebook service opens from the repository (``JOIN_NOTEBOOK_HOSTED_URL``; runs/setup/notebooks.py)."""

from django.core.management.base import BaseCommand

from runs.setup.notebooks import HOSTED_NOTEBOOK, hosted_join_notebook


class Command(BaseCommand):
    help = "Write notebooks/join-a-run.ipynb from runs/setup/notebooks.py (a test checks they agree)."

    def handle(self, *args, **options) -> None:
        HOSTED_NOTEBOOK.parent.mkdir(exist_ok=True)
        HOSTED_NOTEBOOK.write_text(hosted_join_notebook(), encoding="utf-8")
        self.stdout.write(f"wrote {HOSTED_NOTEBOOK}")
