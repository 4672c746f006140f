"""Factories for the test suite: build what a test needs, named for what it is."""

import factory
from django.conf import settings
from django.contrib.auth.models import Permission
from django.utils import timezone

from accounts.models import Team, User
from runs.authority import authority_generate
from runs.forms import preset_config
from runs.models import Run

PASSWORD = "correct horse battery staple"
SERVED = (Run.Status.ACTIVE, Run.Status.PAUSED)  # the statuses a coordinator keeps a backbone peer for
BACKBONE_ADDRESS = "/ip4/127.0.0.1/tcp/31337/p2p/QmcPRjZs2JBxLphEAMJg9ehXMYb9VTcgnoJCvWtqSUbqGZ"


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = User
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"volunteer{n}")
    email = factory.LazyAttribute(lambda user: f"{user.username}@example.org")
    password = factory.PostGenerationMethodCall("set_password", PASSWORD)

    @factory.post_generation
    def organizer(self, create: bool, extracted: bool, **kwargs) -> None:
        if extracted:
            self.user_permissions.add(Permission.objects.get(codename="organize_runs"))
        if create:
            self.save()


class TeamFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Team

    name = factory.Sequence(lambda n: f"Team {n}")
    slug = factory.Sequence(lambda n: f"team-{n}")
    founder = factory.SubFactory(UserFactory)


class RunFactory(factory.django.DjangoModelFactory):
    """An active `tiny` run with its own authority key, a ready tokenizer file and a coordinator that
    has just beaten (a real coordinator replaces the address with its backbone peer's)."""

    class Meta:
        model = Run
        skip_postgeneration_save = True

    name = factory.Sequence(lambda n: f"Run {n}")
    slug = factory.Sequence(lambda n: f"run-{n}")
    status = Run.Status.ACTIVE
    config = factory.LazyFunction(lambda: preset_config("tiny").model_dump(mode="json"))
    tokenizer_status = Run.TokenizerStatus.READY
    initial_peers = factory.LazyAttribute(lambda run: [BACKBONE_ADDRESS] if run.status in SERVED else [])
    coordinator_heartbeat_at = factory.LazyAttribute(lambda run: timezone.now() if run.status in SERVED else None)

    @classmethod
    def _create(cls, model_class, *args, **kwargs):
        public_key, private_key = authority_generate(secret=settings.AUTHORITY_ENCRYPTION_KEY)
        kwargs.setdefault("authority_public_key", public_key)
        kwargs.setdefault("authority_private_key", private_key)
        return super()._create(model_class, *args, **kwargs)

    @factory.post_generation
    def organizers(self, create: bool, extracted: list | None, **kwargs) -> None:
        if create and extracted:
            self.organizers.add(*extracted)
