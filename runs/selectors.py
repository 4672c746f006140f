"""Reads for runs."""

from pathlib import Path

from django.conf import settings
from django.db.models import QuerySet

from runs.models import Run


def run_list_public() -> QuerySet[Run]:
    """Runs anyone may see listed: public, seen by everyone, and started."""
    runs = Run.objects.filter(visibility=Run.Visibility.PUBLIC, audience=Run.Audience.EVERYONE)
    return runs.exclude(status=Run.Status.DRAFT).prefetch_related("organizers")


def tokenizer_try(*, run: Run, text: str) -> list[str]:
    from tokenizers import Tokenizer

    from runs.tokenization import tokenizer_try as tokenize

    with run.tokenizer_file.open("rb") as handle:
        tokenizer = Tokenizer.from_str(handle.read().decode())
    return tokenize(tokenizer, text)


def agent_wheel_path() -> Path | None:
    """The newest wheel in MEDIA_ROOT/agent/, built at deploy by `manage.py agent_wheel`."""
    wheels = sorted((Path(settings.MEDIA_ROOT) / "agent").glob("peer_agent-*.whl"), key=lambda path: path.stat().st_mtime)
    return wheels[-1] if wheels else None
