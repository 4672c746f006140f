"""Who may see a run, train in it, organize it and download its checkpoints: the one place that
answers, for pages, the API, the live board, charts and profiles."""

from django.db.models import QuerySet
from django.utils.translation import gettext as _

from accounts.models import User
from runs.models import Run, RunBan


class JoinRefused(Exception):
    """Why an agent may not join or refresh; `status`, `code` and `retry_after` go into the API error."""

    def __init__(self, status: int, code: str, detail: str, retry_after: int | None = None) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail, self.retry_after = status, code, detail, retry_after


def run_is_organizer(*, run: Run, user: User) -> bool:
    return user.is_authenticated and run.organizers.filter(pk=user.pk).exists()


def run_seen_by_all(*, run: Run) -> bool:
    """Whether whoever has the run's address may see it: a started run whose audience is everyone.
    Read from the run alone, so that a live feed asks nothing per viewer of such a run."""
    return run.status != Run.Status.DRAFT and run.audience != Run.Audience.MEMBERS


def run_may_view(*, run: Run, user: User) -> bool:
    """Drafts are for their organizers; a members-only run for them and its members; every other run
    is visible to whoever has its address. The one answer to "may this person see this run", for
    pages, the API, the live board, charts and profiles."""
    if run_seen_by_all(run=run) or user.is_staff or run_is_organizer(run=run, user=user):
        return True
    return run.status != Run.Status.DRAFT and run_is_member(run=run, user=user)


def run_is_member(*, run: Run, user: User) -> bool:
    """Whether ``user`` may train in the run by its own rule (its invite list, its allowlist, or, for a
    run anyone may join, having joined it) and is not banned from it."""
    if not user.is_authenticated or RunBan.objects.filter(run=run, user=user).exists():
        return False
    if run.visibility == Run.Visibility.INVITE:
        return run.memberships.filter(user=user).exists()
    if run.visibility == Run.Visibility.ALLOWLIST:
        return run.allowlist.filter(pk=user.pk).exists()
    return run.sessions.filter(user=user).exists()


def run_may_download_checkpoints(*, run: Run, user: User) -> bool:
    """Public and unlisted runs share their checkpoints with whoever sees the run; invite-only and
    allowlisted runs only with the people who may train in them (and staff): not with the banned."""
    if not run_may_view(run=run, user=user):
        return False
    if run.visibility in (Run.Visibility.PUBLIC, Run.Visibility.UNLISTED) or user.is_staff:
        return True
    if not user.is_authenticated:
        return False
    if run_is_organizer(run=run, user=user):
        return True
    if RunBan.objects.filter(run=run, user=user).exists():
        return False
    if run.visibility == Run.Visibility.INVITE:
        return run.memberships.filter(user=user).exists()
    return run.allowlist.filter(pk=user.pk).exists()


def run_join_refusal(*, run: Run, user: User) -> JoinRefused | None:
    """The reason `user` may not train in `run` now, or None when they may (in the reader's language
    on the join page; agents send no Accept-Language and read English)."""
    return run_status_refusal(run=run) or run_entry_refusal(run=run, user=user)


def run_status_refusal(*, run: Run) -> JoinRefused | None:
    """Why nobody may train in `run` now (not started, paused, finished), or None."""
    name = {"run": run.slug}
    if run.status == Run.Status.DRAFT:
        return JoinRefused(409, "run_not_active", _("run “%(run)s” has not started yet") % name)
    if run.status == Run.Status.PAUSED:
        return JoinRefused(409, "run_paused",
                           _("run “%(run)s” is paused by its organizer; the agent will retry every 60 s") % name)
    if run.status == Run.Status.FINISHED:
        return JoinRefused(409, "run_finished", _("run “%(run)s” has finished; thank you for contributing") % name)
    return None


def run_entry_refusal(*, run: Run, user: User) -> JoinRefused | None:
    """Why the run's own rule of who may train (its bans, its invite list or allowlist) keeps `user`
    out, whatever the run's status, or None when it lets them in."""
    name = {"run": run.slug}
    if RunBan.objects.filter(run=run, user=user).exists():
        return JoinRefused(403, "banned", _("you were banned from run “%(run)s” by its organizers") % name)
    if run.sessions.filter(user=user, suspended_at__isnull=False).exists():
        # A new session would start with a clean record: the suspension holds for the volunteer.
        return JoinRefused(403, "session_suspended", _("a training session of yours in run “%(run)s” failed spot checks "
                                                       "and is suspended until its organizers review it") % name)
    if run_is_organizer(run=run, user=user):
        return None
    if run.visibility == Run.Visibility.INVITE and not run.memberships.filter(user=user).exists():
        return JoinRefused(403, "invite_only",
                           _("run “%(run)s” is invite-only: enter its join code on the run's page first") % name)
    if run.visibility == Run.Visibility.ALLOWLIST and not run.allowlist.filter(pk=user.pk).exists():
        return JoinRefused(403, "not_allowed", _("run “%(run)s” is open only to volunteers its organizers listed") % name)
    return None


def run_role_refusal(*, run: Run, user: User, role: str) -> JoinRefused | None:
    """Why ``user`` may not join ``run`` as ``role``, or None when they may. An aggregator joins the
    run's averaging groups without computing: only the run's organizers start one, since the groups
    trust every member's share of the average."""
    if role == "aggregator" and not run_is_organizer(run=run, user=user):
        return JoinRefused(403, "not_an_organizer", _("only the organizers of run “%(run)s” may join it as an "
                                                      "aggregator; join as a trainer instead") % {"run": run.slug})
    return None


def visible_run(*, slug: str, user: User, joining: bool = False, join_code: str = "") -> Run | None:
    """The run named ``slug`` if ``user`` may see it; else None, the same answer as for a run that
    does not exist, so that a hidden run's name is not confirmed.

    ``joining`` (the join page, an agent's join): also a started run whose own rule lets ``user`` in,
    or that they bring the invite code of, paused or finished as it may be: the door of a
    members-only run, where the invited learn its name and how to join (docs/organizers.md, "Who
    may see")."""
    run = Run.objects.filter(slug=slug).prefetch_related("organizers").first()
    if run is None:
        return None
    if run_may_view(run=run, user=user):
        return run
    if not joining or run.status == Run.Status.DRAFT:
        return None
    invited = run.visibility == Run.Visibility.INVITE and bool(join_code) and join_code.strip() == run.join_code
    if invited or (user.is_authenticated and run_entry_refusal(run=run, user=user) is None):
        return run
    return None


def run_list_public() -> QuerySet[Run]:
    """Runs anyone may see listed: public, seen by everyone, and started."""
    runs = Run.objects.filter(visibility=Run.Visibility.PUBLIC, audience=Run.Audience.EVERYONE)
    return runs.exclude(status=Run.Status.DRAFT).prefetch_related("organizers")
