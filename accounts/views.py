import datetime

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.translation import gettext as _
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from django.views.i18n import set_language

from accounts import selectors, services
from accounts.auth import request_ip
from accounts.forms import AgentTokenForm, HandOverForm, LoginForm, ProfileForm, SignUpForm, TeamForm
from accounts.models import AgentToken, Notification, Team, User
from accounts.notifications import (
    email_opt_out,
    notification_text,
    notification_url,
    notifications_mark_read,
    unsubscribe_claim,
)
from accounts.password_reset import password_reset_request
from accounts.signup import SignUpFailed, signup_confirm, signup_pending, signup_request
from accounts.verification import (
    VerificationFailed,
    email_change,
    verification_check,
    verification_required,
    verification_send,
)
from portal.ratelimit import RateLimited, rate_limit_hit, rate_limited_page
from runs.credit.volunteers import (
    milestones_shown,
    volunteer_for_profile,
    volunteer_lost_epochs,
    volunteer_machines,
    volunteer_runs,
)
from runs.models import VolunteerCredit


class LoginView(auth_views.LoginView):
    authentication_form = LoginForm

    def form_invalid(self, form: LoginForm) -> HttpResponse:
        response = super().form_invalid(form)
        return rate_limited_page(response, form.rate_limited) if form.rate_limited else response


class PasswordResetView(auth_views.PasswordResetView):
    """Django's page, but the mail is queued (accounts/password_reset.py) and both asker and address are limited."""

    def form_valid(self, form) -> HttpResponse:
        try:
            password_reset_request(email=form.cleaned_data["email"], ip=request_ip(self.request),
                                   language=self.request.LANGUAGE_CODE, domain=self.request.get_host(),
                                   use_https=self.request.is_secure())
        except RateLimited as exc:
            form.add_error(None, _("Too many password resets asked from your address; try again in %(seconds)s s.")
                           % {"seconds": exc.retry_after})
            return rate_limited_page(self.form_invalid(form), exc)
        return redirect(self.get_success_url())


def signup(request: HttpRequest) -> HttpResponse:
    """The sign-up form. While addresses are confirmed it creates no account, only a pending
    sign-up and its mail (accounts/signup.py), and answers the same page for every address."""
    if request.user.is_authenticated:
        return redirect("home")
    form = SignUpForm(request.POST or None)
    if request.method == "POST":
        try:
            rate_limit_hit(name="signup", key=str(request_ip(request)))
        except RateLimited as exc:
            form.add_error(None, _("Too many sign-ups from your address; try again in %(seconds)s s.")
                           % {"seconds": exc.retry_after})
            return rate_limited_page(render(request, "accounts/signup.html", {"form": form}), exc)
    if request.method == "POST" and form.is_valid() and settings.ACCOUNT_EMAIL_VERIFICATION_REQUIRED:
        # The language the volunteer signed up in is that of their e-mails.
        signup_request(username=form.cleaned_data["username"], email=form.cleaned_data["email"],
                       password=form.cleaned_data["password1"], language=request.LANGUAGE_CODE)
        return redirect("signup-sent")
    if request.method == "POST" and form.is_valid():
        user = form.save(commit=False)
        user.language = request.LANGUAGE_CODE
        user.save()
        return _welcome(request, user)
    return render(request, "accounts/signup.html", {"form": form})


def signup_sent(request: HttpRequest) -> HttpResponse:
    return render(request, "accounts/signup_sent.html", {"days": settings.EMAIL_VERIFICATION_DAYS})


def signup_link(request: HttpRequest, secret: str) -> HttpResponse:
    """The link mailed at sign-up. A GET only asks, because mail scanners open links; the button
    creates the account and logs its owner in."""
    try:
        if request.method != "POST":
            return render(request, "accounts/signup_confirm.html", {"pending": signup_pending(secret=secret)})
        user = signup_confirm(secret=secret)
    except SignUpFailed as exc:
        return render(request, "accounts/signup_failed.html", {"reason": str(exc)}, status=400)
    return _welcome(request, user)


def _welcome(request: HttpRequest, user: User) -> HttpResponse:
    login(request, user, backend="django.contrib.auth.backends.ModelBackend")
    messages.success(request, _("Welcome, %(name)s! Create an agent token to start contributing.") % {"name": user.username})
    return redirect("tokens")


@login_required
def profile(request: HttpRequest) -> HttpResponse:
    form = ProfileForm(request.POST or None, instance=request.user)
    if request.method == "POST" and form.is_valid() and "email" in form.changed_data:
        try:  # each new address gets a mail: the limit keeps the form from mailing strangers in bulk
            rate_limit_hit(name="verify_resend", key=str(request.user.pk))
        except RateLimited as exc:
            form.add_error("email", _("We sent several links already; try again in %(seconds)s s.")
                           % {"seconds": exc.retry_after})
            request.user.refresh_from_db()
            return rate_limited_page(render(request, "accounts/profile.html", {"form": form}), exc)
    if request.method == "POST" and form.is_valid():
        user = form.save()
        messages.success(request, _("Your profile was saved."))
        if "email" in form.changed_data:
            email_change(user=user)
            messages.info(request, _("We sent a link to %(email)s: open it to confirm your new address.") % {"email": user.email})
        return redirect("profile")
    return render(request, "accounts/profile.html", {"form": form})


def volunteer_detail(request: HttpRequest, key: str) -> HttpResponse:
    """A volunteer's runs and credit; their machines and the epochs that earned nothing only to themselves.
    Hidden: only the owner."""
    volunteer = volunteer_for_profile(key=key, viewer=request.user)
    if volunteer is None:
        raise Http404("no such volunteer")
    is_owner = request.user.is_authenticated and request.user.pk == volunteer.pk
    context = {
        "volunteer": volunteer,
        "name": volunteer.public_name or volunteer.username,
        "key": key,
        "is_owner": is_owner,
        "totals": VolunteerCredit.objects.filter(user=volunteer).first(),
        "runs": volunteer_runs(user=volunteer, viewer=request.user),
        "machines": volunteer_machines(user=volunteer) if is_owner else None,
        "lost_epochs": volunteer_lost_epochs(user=volunteer) if is_owner else None,
        "milestones": milestones_shown(user=volunteer, viewer=request.user),
    }
    return render(request, "accounts/volunteer_detail.html", context)


def team_list(request: HttpRequest) -> HttpResponse:
    return render(request, "accounts/team_list.html", {"teams": selectors.team_list()})


@login_required
def team_create(request: HttpRequest) -> HttpResponse:
    form = TeamForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            team = services.team_create(founder=request.user, **form.cleaned_data)
        except services.TeamError as exc:
            messages.error(request, str(exc))
        else:
            messages.success(request, _("You founded “%(team)s”.") % {"team": team.name})
            return redirect(team)
    return render(request, "accounts/team_form.html", {"form": form})


def team_detail(request: HttpRequest, slug: str) -> HttpResponse:
    team = get_object_or_404(Team, slug=slug)
    is_founder = request.user.is_authenticated and team.founder_id == request.user.pk
    context = {
        "team": team,
        "members": selectors.team_members(team=team),
        "history": selectors.team_history(team=team)[:50],
        "is_founder": is_founder,
        "is_member": request.user.is_authenticated and request.user.team_id == team.pk,
        "hand_over_form": HandOverForm(team=team, founder=request.user) if is_founder else None,
        "milestones": milestones_shown(team=team, viewer=request.user),
    }
    return render(request, "accounts/team_detail.html", context)


def _team_action(request: HttpRequest, slug: str, action, success: str) -> HttpResponse:
    team = get_object_or_404(Team, slug=slug)
    try:
        action(team)
    except services.TeamError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, success % {"team": team.name})
    return redirect(team)


@login_required
@require_POST
def team_join(request: HttpRequest, slug: str) -> HttpResponse:
    return _team_action(request, slug, lambda team: services.team_join(user=request.user, team=team), _("You joined “%(team)s”."))


@login_required
@require_POST
def team_leave(request: HttpRequest, slug: str) -> HttpResponse:
    return _team_action(request, slug, lambda team: services.team_leave(user=request.user), _("You left “%(team)s”."))


@login_required
@require_POST
def team_disband(request: HttpRequest, slug: str) -> HttpResponse:
    return _team_action(
        request, slug, lambda team: services.team_disband(team=team, founder=request.user), _("“%(team)s” was disbanded.")
    )


@login_required
@require_POST
def team_hand_over(request: HttpRequest, slug: str) -> HttpResponse:
    team = get_object_or_404(Team, slug=slug)
    if team.founder_id != request.user.pk:
        messages.error(request, _("Only the founder can hand the team over."))
        return redirect(team)
    form = HandOverForm(request.POST, team=team, founder=request.user)
    if not form.is_valid():
        messages.error(request, _("Choose another member of the team."))
        return redirect(team)
    successor = form.cleaned_data["successor"]
    return _team_action(
        request,
        slug,
        lambda team: services.team_hand_over(team=team, founder=request.user, successor=successor),
        _("%(name)s now leads “%%(team)s”.") % {"name": successor.username},
    )


@login_required
def token_list(request: HttpRequest) -> HttpResponse:
    form = AgentTokenForm(request.POST or None)
    if verification_required(request.user):
        # The form stays hidden and a post is refused: the page says why and offers a new link.
        context = {"form": form, "tokens": selectors.token_list(user=request.user), "unverified": True}
        return render(request, "accounts/token_list.html", context, status=403 if request.method == "POST" else 200)
    if request.method == "POST":
        try:
            rate_limit_hit(name="token_create", key=str(request.user.pk))
        except RateLimited as exc:
            form.add_error(None, _("You created many tokens in a short time; try again in %(seconds)s s.")
                           % {"seconds": exc.retry_after})
            context = {"form": form, "tokens": selectors.token_list(user=request.user)}
            return rate_limited_page(render(request, "accounts/token_list.html", context), exc)
    if request.method == "POST" and form.is_valid():
        token, secret = services.token_create(
            user=request.user,
            name=form.cleaned_data["name"],
            run=form.cleaned_data["run"],
            lifetime=datetime.timedelta(days=form.cleaned_data["lifetime_days"]),
        )
        # Rendered, not redirected: the secret must never reach a URL, a session or a log.
        response = render(
            request, "accounts/token_list.html",
            {"form": AgentTokenForm(), "tokens": selectors.token_list(user=request.user), "new_token": token, "secret": secret},
        )
        response["Cache-Control"] = "no-store"
        return response
    return render(request, "accounts/token_list.html", {"form": form, "tokens": selectors.token_list(user=request.user)})


@login_required
@require_POST
def token_revoke(request: HttpRequest, pk: int) -> HttpResponse:
    token = get_object_or_404(AgentToken, pk=pk, user=request.user)
    services.token_revoke(token=token)
    messages.success(request, _("Token “%(name)s” was revoked; agents using it are refused from now on.") % {"name": token.name})
    return redirect("tokens")


def email_verify(request: HttpRequest, token: str) -> HttpResponse:
    """The link mailed at a change of address: it works logged out too (the signature names the account)."""
    try:
        user = verification_check(token=token)
    except VerificationFailed as exc:
        return render(request, "accounts/email_verify_failed.html", {"reason": str(exc)}, status=400)
    messages.success(request, _("Your e-mail address %(email)s is confirmed.") % {"email": user.email})
    if request.user.is_authenticated and request.user.pk == user.pk:
        return redirect("tokens")
    return redirect("login")


@login_required
@require_POST
def email_verify_resend(request: HttpRequest) -> HttpResponse:
    if request.user.email_verified:
        messages.info(request, _("Your e-mail address is already confirmed."))
        return redirect("tokens")
    try:
        rate_limit_hit(name="verify_resend", key=str(request.user.pk))
    except RateLimited as exc:
        reason = _("We sent several links already; try again in %(seconds)s s.") % {"seconds": exc.retry_after}
        return rate_limited_page(render(request, "accounts/email_verify_failed.html", {"reason": reason}), exc)
    verification_send(user=request.user)
    messages.success(request, _("We sent a new link to %(email)s.") % {"email": request.user.email})
    return redirect("tokens")


@login_required
def notification_list(request: HttpRequest) -> HttpResponse:
    page = Paginator(selectors.notification_list(user=request.user), 30).get_page(request.GET.get("page"))
    items = [{"notification": n, "text": notification_text(n), "url": notification_url(n)} for n in page]
    return render(request, "accounts/notification_list.html", {"page": page, "items": items})


@login_required
@require_POST
def notification_read(request: HttpRequest) -> HttpResponse:
    """Marks the posted notification ids read, or all with `all`; ids of others' notifications do nothing."""
    ids = request.POST.getlist("id")
    # ASCII digits only: "²" passes str.isdigit() and then fails int().
    well_formed = ids and all(value.isascii() and value.isdigit() and len(value) < 19 for value in ids)
    if not request.POST.get("all") and not well_formed:
        return HttpResponseBadRequest(_("Say which notifications to mark read."), content_type="text/plain; charset=utf-8")
    notifications_mark_read(user=request.user, ids=None if request.POST.get("all") else [int(value) for value in ids])
    return redirect(request.POST.get("next") if request.POST.get("next", "").startswith("/notifications/") else "notifications")


@csrf_exempt  # the signed link is the credential; mail clients' one-click POST (RFC 8058) carries no CSRF token
def unsubscribe(request: HttpRequest, token: str) -> HttpResponse:
    """A notification e-mail's link: GET asks, POST stops that kind of e-mail; no log-in needed.
    A GET changes nothing because mail scanners open links."""
    claim = unsubscribe_claim(token=token)
    if claim is None:
        return render(request, "accounts/unsubscribe.html", {"invalid": True}, status=400)
    user, kind = claim
    label = Notification.Kind(kind).label
    if request.method == "POST":
        email_opt_out(user=user, kind=kind)
    return render(request, "accounts/unsubscribe.html", {"kind": label, "done": request.method == "POST"})


@require_POST
def language_set(request: HttpRequest) -> HttpResponse:
    """The footer's switcher (Django's set_language), remembered on the account too: the
    volunteer's e-mails are written in the language they last chose."""
    response = set_language(request)
    language = request.POST.get("language")
    if request.user.is_authenticated and language in dict(settings.LANGUAGES) and language != request.user.language:
        User.objects.filter(pk=request.user.pk).update(language=language)
    return response
