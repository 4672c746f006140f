"""The world every security test speaks of: the named personas, a public and an invite-only run, and
an invite-only run only its members may see.

anonymous; oscar: logged in, no relation; vik: volunteer of the three runs (member of the invite-only
ones); bruno: banned from the three; olga: organizer of the three; otto: organizer of another run;
stella: staff.
"""

import pytest
from django.contrib.auth.hashers import make_password
from django.core.files.base import ContentFile

from accounts.models import PendingSignUp
from accounts.notifications import unsubscribe_link
from accounts.services import team_create, token_create, token_revoke
from accounts.signup import signup_link_issue
from accounts.verification import verification_link
from runs.access.sessions import session_link_token
from runs.models import Certificate, Checkpoint, Probe, Run, RunCredit, RunMembership, SessionEpoch
from runs.setup.services import data_file_add, run_ban
from tests.factories import PASSWORD, UserFactory
from tests.security.world import World, world_run, world_session


@pytest.fixture
def world(organizer, volunteer, outsider, staff, settings, tmp_path) -> World:
    banned = UserFactory(username="bruno")
    other_organizer = UserFactory(username="otto", organizer=True)
    users = {"anonymous": None, "oscar": outsider, "vik": volunteer, "bruno": banned, "olga": organizer,
             "otto": other_organizer, "stella": staff}
    public, invite = world_run("open-run", "public", organizer), world_run("code-run", "invite", organizer)
    members = world_run("members-run", "invite", organizer, audience=Run.Audience.MEMBERS)
    other = world_run("other-run", "public", other_organizer)
    for run in (public, invite, members):
        run_ban(run=run, actor=organizer, user=banned)
        if run.visibility == Run.Visibility.INVITE:
            RunMembership.objects.create(run=run, user=volunteer)
            RunMembership.objects.create(run=run, user=banned)
    tokens = {name: token_create(user=user, name=f"{name}'s laptop")[1] for name, user in users.items() if user}
    vik_token = token_create(user=volunteer, name="old laptop")
    token_revoke(token=vik_token[0])
    tokens["revoked"] = vik_token[1]
    tokens["elsewhere"] = token_create(user=volunteer, name="lab machine", run=other)[1]
    team = team_create(founder=volunteer, name="Dhaka Compute")
    data_file = data_file_add(run=invite, actor=organizer, name="bn.txt", content=b"a line\n")
    invite_session, public_session = world_session(invite, volunteer, None), world_session(public, volunteer, None)
    checkpoints = {run: Checkpoint.objects.create(run=run, epoch=3, size=2, file=ContentFile(b"PK", name="epoch-3.zip"))
                   for run in (public, invite)}
    (settings.MEDIA_ROOT / "agent").mkdir(parents=True, exist_ok=True)
    (settings.MEDIA_ROOT / "agent" / "peer_agent-0.1.0-py3-none-any.whl").write_bytes(b"PK")
    # vik's confirmed work in the public run, and the certificate it earned (its page recomputes it from here).
    RunCredit.objects.create(run=public, user=volunteer, samples=64, samples_verified=64, credit_verified=112.0, credit=112.0)
    certificate = Certificate.objects.create(run=public, user=volunteer)
    members_session = world_session(members, volunteer, None)
    newcomer = PendingSignUp.objects.create(username="nadia", email="nadia@example.org", password=make_password(PASSWORD))
    values = {
        "public": public.slug, "invite": invite.slug, "members": members.slug, "team": team.slug, "vik_token": vik_token[0].pk,
        "data_file": data_file.pk, "wheel": "peer_agent-0.1.0-py3-none-any.whl",
        "public_session": public_session.pk, "invite_session": invite_session.pk,
        "flag": SessionEpoch.objects.create(session=public_session, epoch=1, reported_samples=64, announced_samples=32,
                                            status=SessionEpoch.Status.FLAGGED).pk,
        # What the organizer routes act on in the members-only run.
        "members_data_file": data_file_add(run=members, actor=organizer, name="bn.txt", content=b"a line\n").pk,
        "members_session": members_session.pk,
        "members_flag": SessionEpoch.objects.create(session=members_session, epoch=1, reported_samples=64,
                                                    announced_samples=32, status=SessionEpoch.Status.FLAGGED).pk,
        "members_probe": _probe(members).pk,
        "vik": volunteer.username,
        "vik_certificate": certificate.code,
        "probe": _probe(public).pk,
        "vik_verify": verification_link(user=volunteer).rsplit("/verify/", 1)[1].strip("/"),
        "signup": signup_link_issue(pending=newcomer).rsplit("/confirm/", 1)[1].strip("/"),
        "vik_unsubscribe": unsubscribe_link(user=volunteer, kind="run_paused").rsplit("/unsubscribe/", 1)[1].strip("/"),
        "invite_data_link": f"{session_link_token(session=invite_session, kind='data', target=data_file)}/{data_file.pk}.txt",
        "invite_checkpoint_link": (f"{session_link_token(session=invite_session, kind='checkpoint', target=checkpoints[invite])}"
                                   f"/{checkpoints[invite].pk}.zip"),
    }
    return World(users, tokens, values)


def _probe(run) -> Probe:
    rows = b"text,label\nx,a\ny,b\n"
    return Probe.objects.create(run=run, name="topics", task=Probe.Task.TEXT, labels=["a", "b"], train_examples=2,
                                test_examples=2, train_file=ContentFile(rows, name="train.csv"),
                                test_file=ContentFile(rows, name="test.csv"))
