"""Reads for runs."""

from django.db.models import QuerySet

from runs.models import Run


def run_list_public() -> QuerySet[Run]:
    """Runs anyone may see listed: public and started."""
    return Run.objects.filter(visibility=Run.Visibility.PUBLIC).exclude(status=Run.Status.DRAFT).prefetch_related("organizers")
