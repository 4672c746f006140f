"""Run pages everyone sees: the run, how to join it, its checkpoints, and the agent download."""

import base64
import datetime
from pathlib import Path

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import Q
from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.html import format_html
from django.utils.translation import gettext as _

from accounts.services import token_create
from accounts.verification import verification_required
from portal.ratelimit import RateLimited, rate_limit_hit, rate_limited_page
from runs.access.rules import run_is_organizer, run_join_refusal, run_list_public, run_may_download_checkpoints, visible_run
from runs.credit import exports
from runs.credit.boards import BY, WINDOWS, board_rows, run_snapshot
from runs.evaluation.probe_scores import probe_score_rows
from runs.models import Run, RunCredit
from runs.setup import services


def visible_run_or_404(request: HttpRequest, slug: str) -> Run:
    run = visible_run(slug=slug, user=request.user)
    if run is None:
        raise Http404("no such run")
    return run


def agent_wheel_path() -> Path | None:
    """The newest wheel in MEDIA_ROOT/agent/, built at deploy by `manage.py agent_wheel`."""
    wheels = sorted((Path(settings.MEDIA_ROOT) / "agent").glob("peer_agent-*.whl"), key=lambda path: path.stat().st_mtime)
    return wheels[-1] if wheels else None


RUNS_PER_PAGE = 20


def run_list(request: HttpRequest) -> HttpResponse:
    """The listed runs, newest first, searched by name or description and paged."""
    query = request.GET.get("q", "").strip()[:100]
    runs = run_list_public()
    if query:
        runs = runs.filter(Q(name__icontains=query) | Q(description__icontains=query))
    # get_page turns a missing, garbled or too large page number into the nearest page, never a 500.
    page = Paginator(runs, RUNS_PER_PAGE).get_page(request.GET.get("page"))
    return render(request, "runs/run_list.html", {"page": page, "query": query})


def run_detail(request: HttpRequest, slug: str) -> HttpResponse:
    run = visible_run_or_404(request, slug)
    is_organizer = run_is_organizer(run=run, user=request.user)
    context = {
        "run": run,
        "config": run.configuration,
        "is_organizer": is_organizer,
        "events": run.events.select_related("actor")[:20] if is_organizer else [],
        "data_files": run.data_files.all(),
        "tokens_tried": None,
        "snapshot": run_snapshot(run=run),
        "checkpoints": run.checkpoints.all() if run_may_download_checkpoints(run=run, user=request.user) else None,
        "certificate": request.user.is_authenticated
        and RunCredit.objects.filter(run=run, user=request.user, credit__gt=0).exists(),
        "probe_rows": probe_score_rows(run=run),
    }
    if is_organizer and request.GET.get("try") and run.tokenizer_status == Run.TokenizerStatus.READY:
        context["tokens_tried"] = services.run_tokenizer_try(run=run, text=request.GET["try"][:1000])
    return render(request, "runs/run_detail.html", context)


def checkpoint_download(request: HttpRequest, slug: str, epoch: int) -> FileResponse:
    """A checkpoint's zip, for whoever may download the run's checkpoints (others get a 404)."""
    run = visible_run_or_404(request, slug)
    if not run_may_download_checkpoints(run=run, user=request.user):
        raise Http404("no such run")
    checkpoint = get_object_or_404(run.checkpoints, epoch=epoch)
    return FileResponse(checkpoint.file.open("rb"), as_attachment=True, filename=f"{run.slug}-epoch{epoch}.zip",
                        content_type="application/zip")


def agent_package(portal_url: str) -> str:
    """What pip installs the agent from: this portal's wheel, else the package index's peer-agent."""
    wheel = agent_wheel_path()
    return f"{portal_url}/agent/{wheel.name}" if wheel else "peer-agent"


def _install_command(portal_url: str) -> str:
    return f"pip install {agent_package(portal_url)}"


def _join_command(portal_url: str, run: Run, secret: str | None = None) -> str:
    token = secret or "<your agent token>"
    return f"PEER_AGENT_TOKEN={token} peer-agent join --portal {portal_url} {run.slug}"


def _agent_toml(portal_url: str, run: Run, secret: str) -> str:
    return f'# peer-agent configuration for run "{run.slug}"\nportal = "{portal_url}"\nrun = "{run.slug}"\ntoken = "{secret}"\n'


@login_required
def run_join_page(request: HttpRequest, slug: str) -> HttpResponse:
    """How to join: install the agent, get a token for this run, run one command. A run only its
    members may see shows this page also to whoever may join it, and to whoever brings its join
    code (the invite link on the run's page: `?code=`)."""
    code = request.GET.get("code") or request.POST.get("code") or ""
    run = visible_run(slug=slug, user=request.user, joining=True, join_code=code)
    if run is None:
        raise Http404("no such run")
    portal_url = request.build_absolute_uri("/").rstrip("/")
    refusal = run_join_refusal(run=run, user=request.user)
    context = {
        "run": run,
        "refusal": refusal,
        "needs_code": refusal is not None and refusal.code == "invite_only",
        "install_command": _install_command(portal_url),
        "join_command": _join_command(portal_url, run),
        "portal_url": portal_url,
        "hosted_notebook": settings.JOIN_NOTEBOOK_HOSTED_URL,
        "unverified": request.user.is_authenticated and verification_required(request.user),
    }
    if request.method == "POST" and request.POST.get("action") == "code":
        try:
            services.run_membership_redeem(run=run, user=request.user, code=request.POST.get("code", ""))
        except services.RunError as exc:
            messages.error(request, str(exc))
        return redirect("run-join", slug=run.slug)
    if request.method == "POST" and request.POST.get("action") == "token" and context["unverified"]:
        return render(request, "runs/run_join.html", context, status=403)  # the page says why
    if request.method == "POST" and request.POST.get("action") == "token" and refusal is None:
        try:
            rate_limit_hit(name="token_create", key=str(request.user.pk))
        except RateLimited as exc:
            messages.error(request, _("You created many tokens in a short time; try again in %(seconds)s s.")
                           % {"seconds": exc.retry_after})
            return rate_limited_page(render(request, "runs/run_join.html", context), exc)
        machine = (request.POST.get("machine") or "").strip()[:64] or f"{run.slug} agent"
        token, secret = token_create(
            user=request.user, name=machine, run=run, lifetime=datetime.timedelta(days=settings.AGENT_TOKEN_DEFAULT_DAYS)
        )
        toml = _agent_toml(portal_url, run, secret)
        context.update(
            new_token=token,
            join_command=_join_command(portal_url, run, secret),
            agent_toml_href="data:application/toml;base64," + base64.b64encode(toml.encode()).decode(),
        )
        response = render(request, "runs/run_join.html", context)
        response["Cache-Control"] = "no-store"  # the page carries the secret
        return response
    return render(request, "runs/run_join.html", context)


def agent_links(request: HttpRequest) -> HttpResponse:
    """pip's ``--find-links`` page: a link to the agent's current wheel, whose name changes with each
    build (notebooks/join-a-run.ipynb installs from it); none before `manage.py agent_wheel` ran."""
    wheel = agent_wheel_path()
    link = format_html('<a href="{}">{}</a>', wheel.name, wheel.name) if wheel else ""
    return HttpResponse(format_html("<!DOCTYPE html>\n<html><body>{}</body></html>\n", link))


def agent_wheel(request: HttpRequest, filename: str) -> FileResponse:
    """The peer-agent wheel built by `manage.py agent_wheel` (pip needs its real file name)."""
    wheel = agent_wheel_path()
    if wheel is None or wheel.name != filename:
        raise Http404("no such agent build; the join page links the current one")
    return FileResponse(wheel.open("rb"), as_attachment=True, filename=wheel.name, content_type="application/octet-stream")


def leaderboard(request: HttpRequest) -> HttpResponse:
    """The board across all runs, by volunteer or team, over a window (bad choices fall back)."""
    by = request.GET.get("by") if request.GET.get("by") in BY else "user"
    window = request.GET.get("window") if request.GET.get("window") in WINDOWS else "all"
    rows = board_rows(run=None, by=by, window=window, limit=100)
    return render(request, "runs/leaderboard.html", {"rows": rows, "by": by, "window": window, "windows": list(WINDOWS)})


def stats_list(request: HttpRequest) -> HttpResponse:
    return render(request, "runs/stats.html", {"dumps": exports.stats_dumps()})


def stats_file(request: HttpRequest, day: str, name: str) -> FileResponse:
    path = exports.stats_file(day=day, name=name)
    if path is None:
        raise Http404("no such statistics file; the stats page lists them")
    return FileResponse(path.open("rb"), as_attachment=True, filename=f"{day}-{name}", content_type="application/gzip")
