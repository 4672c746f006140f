"""The parts of `bench/webtier.py` that run inside a checkout's own Python: its code first on
PYTHONPATH, its database in DATABASE_URL. `bench/webtier.py` sends this file's source with
`python -c`, so that a baseline checkout, which may lack the file, runs the same code:

    python -c "$(cat bench/webtier_checkout.py)" import web      # or: import worker
    python -c "$(cat bench/webtier_checkout.py)" seed SLUG VOLUNTEERS

`import web` and `import worker` print one JSON line: seconds from the first line of this script
to the portal's web application (or Celery worker) loaded, the modules loaded, resident memory,
and which heavy libraries came in with them. `seed` fills a fresh database with one public active
run and VOLUNTEERS volunteers with credit, through the models found by app label
(`django.apps.apps.get_model`), so that it does not depend on which module of `runs` defines
what; the run's configuration comes from `peer_agent.protocol`, as the portal's own presets do.
"""

import time

STARTED = time.perf_counter()

import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

HEAVY = ("torch", "hivemind", "transformers")


def web_load() -> dict:
    """What a web process loads before its first answer: Django, the ASGI application
    (portal/asgi.py) and the URL configuration (portal/urls.py), which Django imports on the
    first request."""
    import django

    django.setup()
    from django.urls import get_resolver

    import portal.asgi  # noqa: F401

    return {"url_patterns": len(get_resolver().url_patterns)}


def worker_load() -> dict:
    """What `celery -A portal worker` loads before taking a task: the Celery application
    (portal/celery.py) and every app's tasks (its autodiscovery)."""
    import django

    django.setup()
    from portal.celery import app

    app.loader.import_default_modules()
    return {"tasks": len([name for name in app.tasks if not name.startswith("celery.")])}


def import_measure(kind: str) -> dict:
    extra = {"web": web_load, "worker": worker_load}[kind]()
    seconds = time.perf_counter() - STARTED
    modules = len(sys.modules)
    heavy = [name for name in HEAVY if name in sys.modules]
    import psutil  # after the count: the measurement's own module is not the portal's

    import portal

    return {"seconds": seconds, "modules": modules, "rss_mb": psutil.Process().memory_info().rss / 2**20,
            "heavy": heavy, "portal": os.path.dirname(portal.__file__), **extra}


def seed(slug: str, volunteers: int) -> dict:
    """One public active run with a `tiny` configuration, an organizer, and ``volunteers``
    volunteers with confirmed credit in it (per-run, across-runs and the run's total rows), so that
    every board has rows. The run's authority key is a placeholder: nothing here joins it."""
    import django

    django.setup()
    import datetime

    from django.apps import apps
    from django.db import transaction
    from django.utils import timezone

    from peer_agent.protocol import config_from_preset

    User = apps.get_model("accounts", "User")
    Run = apps.get_model("runs", "Run")
    RunCredit = apps.get_model("runs", "RunCredit")
    VolunteerCredit = apps.get_model("runs", "VolunteerCredit")
    RunCreditTotal = apps.get_model("runs", "RunCreditTotal")
    now = timezone.now()
    with transaction.atomic():
        organizer = User.objects.create(username="bench-organizer", email="bench-organizer@bench.invalid", password="!")
        run = Run.objects.create(
            name="Web tier bench", slug=slug, description="A run for bench/webtier.py.", status="active",
            visibility="public", config=config_from_preset("tiny").model_dump(mode="json"),
            authority_public_key="bench: no authority key", authority_private_key=b"",
        )
        run.organizers.add(organizer)
        people = User.objects.bulk_create([
            # Pseudonyms given, not drawn: 100,000 draws of the default's 32 random bits collide.
            User(username=f"bench-{index}", email=f"bench-{index}@bench.invalid", password="!", pseudonym=f"bench-{index}",
                 display_name=f"Volunteer {index}" if index % 3 == 0 else "")
            for index in range(volunteers)
        ])
        figures = []
        for index, person in enumerate(people):
            samples = 64 * (volunteers - index) * 100
            credit = samples / 64.0
            figures.append({
                "user": person, "samples": samples, "samples_verified": samples, "credit_verified": credit,
                "credit": credit, "samples_24h": samples // 7, "credit_24h": credit / 7, "samples_7d": samples,
                "credit_7d": credit, "compute_seconds": samples / 20.0, "recent_average_credit": credit / 7,
                "rac_updated_at": now, "last_seen_at": now - datetime.timedelta(minutes=index), "machines": 1 + index % 2,
            })
        RunCredit.objects.bulk_create([RunCredit(run=run, **row) for row in figures])
        VolunteerCredit.objects.bulk_create([VolunteerCredit(**row) for row in figures])
        total = {column: sum(row[column] for row in figures)
                 for column in ("samples", "samples_verified", "credit_verified", "credit", "samples_24h", "credit_24h",
                                "samples_7d", "credit_7d")}
        RunCreditTotal.objects.create(run=run, **total)
        # The rows stand in for a rollup pass, which moves the boards' version (runs/credit/boards.py caches
        # boards under it); a checkout from before that cache has no such version.
        # With REDIS_URL, the version is published once this transaction commits (portal/snapshots.py).
        CreditRollup = apps.get_model("runs", "CreditRollup")
        if any(field.name == "boards_version" for field in CreditRollup._meta.get_fields()):
            from runs.models import CreditRollup  # the model's class: its boards_changed, which app models lack

            CreditRollup.boards_changed()
    return {"run": run.slug, "volunteers": len(people)}


if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    if sys.argv[1] == "import":
        print(json.dumps(import_measure(sys.argv[2])))
    elif sys.argv[1] == "seed":
        print(json.dumps(seed(sys.argv[2], int(sys.argv[3]))))
    else:
        raise SystemExit(f"unknown command {sys.argv[1]!r}")
