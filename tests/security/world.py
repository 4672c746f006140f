"""What the security tests build their world from (tests/security/conftest.py's `world` fixture
builds it): the runs and sessions of the named personas, and the `World` it hands the tests."""

import dataclasses

from django.core.files.base import ContentFile
from django.utils import timezone

from runs.models import Run, TrainingSession
from tests.factories import RunFactory, join_body


@dataclasses.dataclass
class World:
    users: dict
    tokens: dict  # token persona -> secret
    values: dict  # what fills the path templates


def world_run(slug: str, visibility: str, organizer, audience: str = Run.Audience.EVERYONE) -> Run:
    run = RunFactory(slug=slug, visibility=visibility, audience=audience, organizers=[organizer])
    run.tokenizer_file.save(f"{slug}-tokenizer.json", ContentFile(b'{"version": "1.0"}'))
    return run


def world_session(run: Run, user, token) -> TrainingSession:
    return TrainingSession.objects.create(
        run=run, user=user, token=token, peer_public_key=join_body("any")["peer_public_key"], agent_version="0.1.0",
        access_expires_at=timezone.now(),
    )
