"""With DEBUG off, pages link the static files by the hashed names that ``collectstatic`` writes to
its manifest, so that browsers may cache them for good. Without the manifest every page that links
one answers 500; the web process refuses to start instead, naming the command that writes it."""

from pathlib import Path

from django.conf import settings
from django.contrib.staticfiles.storage import ManifestFilesMixin
from django.core.exceptions import ImproperlyConfigured
from django.core.files.storage import storages


def static_manifest_require() -> None:
    storage = storages["staticfiles"]
    if isinstance(storage, ManifestFilesMixin) and storage.read_manifest() is None:
        raise ImproperlyConfigured(
            f"{Path(settings.STATIC_ROOT) / storage.manifest_name} is missing, and with DEBUG off every page "
            "links the static files it names: run `python manage.py collectstatic --noinput` before starting "
            "the web server (docs/deploy.md, Release steps)."
        )
