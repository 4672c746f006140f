"""`manage.py demo`: the whole portal on embedded defaults, on one machine, in one command."""

import os
import signal
import subprocess
import sys

from django.conf import settings
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.core.management.base import BaseCommand

from accounts.models import User

DEMO_PEOPLE = [
    # username, password, organizer
    ("organizer", "organizer-demo-pass", True),
    ("volunteer", "volunteer-demo-pass", False),
]


def demo_people_ensure() -> list[tuple[str, str, bool]]:
    """Create the demo accounts (again, with their known passwords) and return them."""
    permission = Permission.objects.get(codename="organize_runs")
    for username, password, is_organizer in DEMO_PEOPLE:
        user, _ = User.objects.get_or_create(username=username, defaults={"email": f"{username}@demo.invalid"})
        user.set_password(password)
        user.save()
        if is_organizer:
            user.user_permissions.add(permission)
    return DEMO_PEOPLE


class Command(BaseCommand):
    help = "Migrate, create demo accounts and serve the portal until Ctrl-C."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--host", default=os.environ.get("DEMO_HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("DEMO_PORT", "8000")))

    def handle(self, *args, host: str, port: int, **options) -> None:
        call_command("migrate", verbosity=0)
        people = demo_people_ensure()
        url = f"http://{host}:{port}"
        self.stdout.write(self.style.SUCCESS(f"\nDeDLOC Portal demo on {url}\n"))
        for username, password, is_organizer in people:
            role = "organizer" if is_organizer else "volunteer"
            self.stdout.write(f"  {role:<10} log in as {username!r} with password {password!r}")
        self.stdout.write(f"  database   {settings.DATABASES['default']['NAME']}\n  Ctrl-C stops everything.\n")
        env = {**os.environ, "SITE_URL": url}
        web = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "portal.asgi:application", "--host", host, "--port", str(port), "--log-level", "warning"],
            env=env,
        )
        try:
            web.wait()
        except KeyboardInterrupt:
            web.send_signal(signal.SIGINT)
            web.wait(timeout=15)
