"""Factories for the test suite: build what a test needs, named for what it is."""

import datetime
import re

import factory
from django.conf import settings
from django.contrib.auth.models import Permission
from django.core import mail
from django.utils import timezone

from accounts.models import Team, User
from runs.access.authority import access_token_sign, authority_generate, authority_load
from runs.models import ContributionEvent, Run, SessionEpoch, TrainingSession
from runs.setup.forms import preset_config

PASSWORD = "correct horse battery staple"
SERVED = (Run.Status.ACTIVE, Run.Status.PAUSED)  # the statuses a coordinator keeps a backbone peer for
BACKBONE_ADDRESS = "/ip4/127.0.0.1/tcp/31337/p2p/QmcPRjZs2JBxLphEAMJg9ehXMYb9VTcgnoJCvWtqSUbqGZ"


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = User
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"volunteer{n}")
    email = factory.LazyAttribute(lambda user: f"{user.username}@example.org")
    # Confirmed, as most accounts are; tests of verification pass email_verified_at=None.
    email_verified_at = factory.LazyFunction(timezone.now)
    password = factory.PostGenerationMethodCall("set_password", PASSWORD)

    @factory.post_generation
    def organizer(self, create: bool, extracted: bool, **kwargs) -> None:
        if extracted:
            self.user_permissions.add(Permission.objects.get(codename="organize_runs"))
        if create:
            self.save()


def signup_link_in(message) -> str:
    """The path of the link that creates the account, in a sign-up mail (its text and HTML parts alike)."""
    [path] = set(re.findall(r"https?://[^/\s]+(/accounts/signup/confirm/[^\s\"<]+/)", message.body))
    assert path in message.alternatives[0][0], "the plain text and the HTML part carry the same link"
    return path


def sign_up(client, username: str, email: str, password: str = PASSWORD):
    """Sign up through the form and confirm with the mailed link, as a newcomer does; the link's answer."""
    client.post("/accounts/signup/", {"username": username, "email": email, "password1": password, "password2": password})
    return client.post(signup_link_in(mail.outbox[-1]))


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


def join_body(run: str, key=None, *, role: str = "trainer") -> dict:
    """A join of ``run`` as the current agent sends it: signed with ``key`` (a fresh hivemind key by
    default), from a CPU, as a trainer (or ``role``)."""
    from hivemind.utils.crypto import RSAPrivateKey

    from peer_agent import __version__
    from peer_agent.join import join_request_signed
    from peer_agent.protocol import DeviceInfo

    request = join_request_signed(key or RSAPrivateKey(), run=run, agent_version=__version__,
                                  device=DeviceInfo(kind="cpu", name="test CPU", memory_gb=8), role=role)
    return request.model_dump(mode="json", exclude_none=True)


# A fixed moment for tests of the credit rollup (tests/runs/conftest.py's clock starts there).
NOW = datetime.datetime(2026, 11, 29, 12, 30, tzinfo=datetime.UTC)


def session_for(run, user, *, machine: str = "laptop") -> TrainingSession:
    """A training session of ``user`` in ``run`` from an agent token named ``machine``."""
    from accounts.services import token_create

    token, _ = token_create(user=user, name=machine)
    return TrainingSession.objects.create(run=run, user=user, token=token, peer_public_key="ssh-rsa AAAA",
                                          agent_version="0.1.0", access_expires_at=NOW)


def report(session, samples: int, *, at: datetime.datetime = NOW, rate: float = 10.0, epoch: int = 1,
           confirmed: bool = True) -> ContributionEvent:
    """A stored report of ``samples`` for ``epoch``; ``confirmed``: and what the coordinator's monitor
    does once the epoch closes and the peer's signed records agree, at the same moment (the epoch
    verified with the samples reported so far)."""
    event = ContributionEvent.objects.create(session=session, seq=session.events.count() + 1, samples=samples, steps=1,
                                             local_epoch=epoch, loss=5.0, samples_per_second=rate, sent_at=at,
                                             received_at=at)
    if confirmed:
        epoch_confirm(session, epoch, at=at)
    return event


def epoch_confirm(session, epoch: int, *, at: datetime.datetime) -> SessionEpoch:
    """The monitor's verdict on a session's epoch whose signed records announce what it reported."""
    reported = sum(session.events.filter(local_epoch=epoch).values_list("samples", flat=True))
    row, _ = SessionEpoch.objects.update_or_create(session=session, epoch=epoch, defaults=dict(
        reported_samples=reported, announced_samples=reported, status=SessionEpoch.Status.VERIFIED, checked_at=at))
    return row


class RunAuthority:
    """A run's authority as the portal holds it (public text, encrypted private half), signing access
    tokens for hivemind peer keys (``hivemind.utils.crypto.RSAPrivateKey``)."""

    SECRET = "portal-secret-for-tests"

    def __init__(self):
        self.public_text, self.encrypted = authority_generate(secret=self.SECRET)
        self.private_key = authority_load(encrypted=self.encrypted, secret=self.SECRET)

    @property
    def public_key(self):
        """The public half as hivemind's ``RSAPublicKey``, what peers check tokens with."""
        from peer_agent.authorizer import rsa_public_key_parse

        return rsa_public_key_parse(self.public_text)

    def sign(self, peer_key, *, username: str = "volunteer", lifetime=datetime.timedelta(minutes=30)) -> dict:
        return access_token_sign(private_key=self.private_key, username=username,
                                 peer_public_key=peer_key.get_public_key().to_bytes(), lifetime=lifetime)

