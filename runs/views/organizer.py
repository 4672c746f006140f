"""Pages and actions for a run's organizers: configure, start and stop, moderate, data, tokenizer,
downstream probes, flagged credit."""

from collections.abc import Callable
from functools import wraps

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.translation import gettext as _
from django.utils.translation import ngettext
from django.views.decorators.http import require_POST

from accounts.models import User
from peer_agent.protocol import MID_RUN_EDITABLE
from runs.access.rules import run_is_organizer, visible_run
from runs.credit import verification
from runs.models import DataFile, Probe, Run, SessionEpoch, TrainingSession
from runs.setup import services, start
from runs.setup.config_labels import FIELDS
from runs.setup.forms import PRESETS, ProbeForm, RunForm, preset_config
from runs.setup.probes import ProbeFormatError, probe_add, probe_remove


def _run_for(request: HttpRequest, slug: str, *, may: Callable[[Run], bool], refusal: str) -> Run:
    """The run named ``slug`` if the user may act on it (``may(run)``); a run they may not see (a
    draft, a members-only run) is a 404 as for one that does not exist, so that its slug is not
    confirmed; a run they see but may not act on is a 403 with ``refusal``."""
    run = visible_run(slug=slug, user=request.user)
    if run is None:
        raise Http404("no such run")
    if not may(run):
        raise PermissionDenied(refusal)
    return run


def organizer_required(view):
    """Only the run's organizers; a 404 to whoever may not see the run, a 403 to who sees it."""

    @login_required
    @wraps(view)
    def wrapper(request: HttpRequest, slug: str, *args, **kwargs) -> HttpResponse:
        run = _run_for(request, slug, may=lambda run: run_is_organizer(run=run, user=request.user),
                       refusal="only the run's organizers can do this")
        return view(request, run, *args, **kwargs)

    return wrapper


def _then(request: HttpRequest, run: Run, action, success: str) -> HttpResponse:
    try:
        action()
    except services.RunError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, success)
    return redirect(run)


@login_required
def run_create(request: HttpRequest) -> HttpResponse:
    if not request.user.is_organizer:
        raise PermissionDenied("creating runs needs the organizer role; ask the portal's staff for it")
    preset = request.GET.get("preset", "tiny")
    if preset not in PRESETS:
        preset = "tiny"
    form = RunForm(request.POST or None, initial=RunForm.initial_from(config=preset_config(preset)), user=request.user)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        with transaction.atomic():
            run = services.run_create(
                organizer=request.user,
                name=data["name"],
                slug=data["slug"],
                description=data["description"],
                visibility=data["visibility"],
                audience=data["audience"],
                config=form.config,
                heldout_size=data["heldout_size"],
                validation_split=data["validation_split"],
                card=form.card(),
            )
            if form.start_source is not None:
                start.run_start_set(run=run, actor=request.user, source=form.start_source)
        messages.success(request, _("Run “%(name)s” was created as a draft. Add data and a tokenizer, then activate it.")
                         % {"name": run.name})
        return redirect(run)
    return render(request, "runs/run_form.html", {"form": form, "presets": PRESETS, "preset": preset, "run": None})


@organizer_required
def run_edit(request: HttpRequest, run: Run) -> HttpResponse:
    initial = RunForm.initial_from(config=run.configuration, run=run)
    form = RunForm(request.POST or None, initial=initial, run=run, user=request.user)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            with transaction.atomic():
                changed = services.run_update(
                    run=run, actor=request.user, name=data["name"], description=data["description"],
                    visibility=data["visibility"], audience=data["audience"], config=form.config, card=form.card(),
                    heldout_size=data["heldout_size"], validation_split=data["validation_split"],
                )
                _start_apply(form, run=run, actor=request.user)
        except services.RunError as exc:
            form.add_error(None, str(exc))
        else:
            fields = ", ".join(sorted(str(FIELDS[path][0]) for path in changed)) or _("no configuration")
            messages.success(request, _("Saved. Changed: %(fields)s.") % {"fields": fields})
            return redirect(run)
    context = {"form": form, "run": run,
               "mid_run_editable": sorted(str(FIELDS[path][0]) for path in MID_RUN_EDITABLE)}
    return render(request, "runs/run_form.html", context)


def _start_apply(form: RunForm, *, run: Run, actor: User) -> None:
    """Make the run start from the source the form resolved, or from random weights once it was emptied."""
    if form.start_source is not None:
        start.run_start_set(run=run, actor=actor, source=form.start_source)
    elif form.start_changed:
        start.run_start_clear(run=run, actor=actor)


@require_POST
@organizer_required
def run_action(request: HttpRequest, run: Run, action: str) -> HttpResponse:
    if action not in services.TRANSITIONS:
        raise PermissionDenied("unknown action")
    return _then(request, run, lambda: services.run_transition(run=run, actor=request.user, action=action),
                 {"activate": _("Run activated."), "pause": _("Run paused."), "resume": _("Run resumed."),
                  "finish": _("Run finished."),
                  "restart": _("Run restarted: agents go on from its last checkpoint.")}[action])


@organizer_required
def run_participants(request: HttpRequest, run: Run) -> HttpResponse:
    context = {
        "run": run,
        "sessions": run.sessions.select_related("user", "token")[:200],
        "bans": run.bans.select_related("user", "banned_by"),
    }
    return render(request, "runs/run_participants.html", context)


@require_POST
@organizer_required
def run_ban(request: HttpRequest, run: Run) -> HttpResponse:
    user = User.objects.filter(username=request.POST.get("username", "").strip()).first()
    if user is None:
        messages.error(request, _("No volunteer has that username."))
        return redirect("run-participants", slug=run.slug)
    reason = request.POST.get("reason", "")[:500]
    _then(request, run, lambda: services.run_ban(run=run, actor=request.user, user=user, reason=reason),
          _("%(name)s is banned.") % {"name": user.username})
    return redirect("run-participants", slug=run.slug)


@require_POST
@organizer_required
def run_unban(request: HttpRequest, run: Run) -> HttpResponse:
    user = get_object_or_404(User, username=request.POST.get("username", ""))
    services.run_unban(run=run, actor=request.user, user=user)
    messages.success(request, _("%(name)s may join again.") % {"name": user.username})
    return redirect("run-participants", slug=run.slug)


@require_POST
@organizer_required
def run_allowlist(request: HttpRequest, run: Run) -> HttpResponse:
    usernames = [name.strip() for name in request.POST.get("usernames", "").replace("\n", ",").split(",") if name.strip()]
    return _then(
        request, run, lambda: services.run_allowlist_set(run=run, actor=request.user, usernames=usernames),
        ngettext("The allowlist has %(count)d volunteer.", "The allowlist has %(count)d volunteers.", len(usernames))
        % {"count": len(usernames)},
    )


@require_POST
@organizer_required
def data_upload(request: HttpRequest, run: Run) -> HttpResponse:
    upload = request.FILES.get("file")
    if upload is None:
        messages.error(request, _("Choose a text file to upload."))
        return redirect(run)
    if upload.size > settings.DATA_FILE_MAX_BYTES:
        messages.error(request, _("The file is larger than %(size)s MiB.") % {"size": settings.DATA_FILE_MAX_BYTES // 2**20})
        return redirect(run)
    content = upload.read()
    return _then(
        request, run, lambda: services.data_file_add(run=run, actor=request.user, name=upload.name, content=content),
        _("Uploaded %(name)s.") % {"name": upload.name},
    )


@require_POST
@organizer_required
def data_remove(request: HttpRequest, run: Run, pk: int) -> HttpResponse:
    data_file = get_object_or_404(DataFile, pk=pk, run=run)
    return _then(request, run, lambda: services.data_file_remove(data_file=data_file, actor=request.user), _("Removed."))


@require_POST
@organizer_required
def tokenizer_train(request: HttpRequest, run: Run) -> HttpResponse:
    return _then(
        request, run, lambda: services.tokenizer_train_start(run=run, actor=request.user),
        _("Tokenizer training started; this page shows when it is ready."),
    )


@require_POST
@organizer_required
def tokenizer_upload(request: HttpRequest, run: Run) -> HttpResponse:
    upload = request.FILES.get("file")
    if upload is None or upload.size > settings.TOKENIZER_MAX_BYTES:
        messages.error(request, _("Choose a tokenizer.json file of at most 20 MiB."))
        return redirect(run)
    try:
        json_text = upload.read().decode("utf-8")
    except UnicodeDecodeError:
        messages.error(request, _("tokenizer.json must be UTF-8 JSON, as the tokenizers library saves it."))
        return redirect(run)
    return _then(
        request, run, lambda: services.tokenizer_upload(run=run, actor=request.user, json_text=json_text),
        _("Tokenizer uploaded."),
    )


def _credit_reviewer_run(request: HttpRequest, slug: str) -> Run:
    """The run, if the user may decide its flagged credit: its organizers and the portal's staff."""
    return _run_for(request, slug, may=lambda run: request.user.is_staff or run_is_organizer(run=run, user=request.user),
                    refusal="only the run's organizers can review its flagged credit")


@login_required
def run_flags(request: HttpRequest, slug: str) -> HttpResponse:
    run = _credit_reviewer_run(request, slug)
    return render(request, "runs/flags.html", {"run": run, "flags": verification.flags_for_run(run=run),
                                               "suspended": verification.suspended_sessions(run=run),
                                               "disagreeing": verification.disagreeing_sessions(run=run)})


@require_POST
@login_required
def run_session_unsuspend(request: HttpRequest, slug: str, pk: int) -> HttpResponse:
    run = _credit_reviewer_run(request, slug)
    session = get_object_or_404(TrainingSession, pk=pk, run=run)
    try:
        verification.session_unsuspend(session=session, by=request.user)
    except verification.CreditError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, _("Session %(session)d of %(name)s may train again; its flagged epochs still wait for "
                                    "your decisions.") % {"session": session.pk, "name": session.user.username})
    return redirect("run-flags", slug=run.slug)


@require_POST
@login_required
def run_flag_decide(request: HttpRequest, slug: str, pk: int, decision: str) -> HttpResponse:
    run = _credit_reviewer_run(request, slug)
    flag = get_object_or_404(SessionEpoch, pk=pk, session__run=run)
    decide = {"accept": verification.flag_accept, "reject": verification.flag_reject}.get(decision)
    if decide is None:
        raise Http404("unknown decision")
    try:
        decide(row=flag, by=request.user)
    except verification.CreditError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, _("Epoch %(epoch)s of %(name)s: %(status)s.")
                         % {"epoch": flag.epoch, "name": flag.session.user.username, "status": flag.get_status_display()})
    return redirect("run-flags", slug=run.slug)


@organizer_required
def run_probes(request: HttpRequest, run: Run) -> HttpResponse:
    """The run's downstream probes and the form that uploads one; a refused upload answers 400 with
    the form's errors and stores nothing."""
    form = ProbeForm(request.POST or None, request.FILES or None, run=run)
    status = 200
    if request.method == "POST":
        if form.is_valid():
            data = form.cleaned_data
            try:
                probe_add(run=run, actor=request.user, name=data["name"], task=data["task"],
                          train=form.contents["train"], test=form.contents["test"])
            except ProbeFormatError as exc:
                form.add_error(None, str(exc))
            else:
                messages.success(request, _("Probe %(name)s added; it runs on the next checkpoint due.") % {"name": data["name"]})
                return redirect("run-probes", slug=run.slug)
        status = 400
    context = {"run": run, "form": form, "probes": run.probes.all(), "max_kib": settings.PROBE_MAX_FILE_BYTES // 1024}
    return render(request, "runs/run_probes.html", context, status=status)


@require_POST
@organizer_required
def run_probe_remove(request: HttpRequest, run: Run, pk: int) -> HttpResponse:
    probe = get_object_or_404(Probe, pk=pk, run=run)
    probe_remove(probe=probe, actor=request.user)
    messages.success(request, _("Probe %(name)s removed, with its scores.") % {"name": probe.name})
    return redirect("run-probes", slug=run.slug)
