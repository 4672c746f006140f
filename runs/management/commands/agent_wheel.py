"""`manage.py agent_wheel`: build the peer-agent wheel that the join page tells volunteers to install."""

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = "Build peer_agent/ into a wheel under MEDIA_ROOT/agent/, served at /agent/<wheel>."

    def handle(self, *args, **options) -> None:
        target = Path(settings.MEDIA_ROOT) / "agent"
        target.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as build_dir:
            # No build isolation: the build uses the setuptools already installed, with no download.
            result = subprocess.run(
                [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", build_dir,
                 str(settings.BASE_DIR)],
                capture_output=True, text=True,
            )
            if result.returncode != 0:
                raise CommandError(f"building the agent wheel failed:\n{result.stdout}\n{result.stderr}")
            for old in target.glob("peer_agent-*.whl"):
                old.unlink()
            for wheel in Path(build_dir).glob("peer_agent-*.whl"):
                shutil.move(wheel, target / wheel.name)
                self.stdout.write(f"built {target / wheel.name}")
