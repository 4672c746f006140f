"""Contribution certificates: the volunteer's own download, and the public page its link verifies."""

import re

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse

from accounts.models import User
from runs.access.rules import run_may_view
from runs.credit.certificates import certificate_facts, certificate_for, certificate_png, certificate_svg
from runs.models import Certificate
from runs.views.pages import visible_run_or_404

CODE = re.compile(r"[A-Za-z0-9_-]{16,32}")
CONTENT_TYPES = {"svg": "image/svg+xml", "png": "image/png"}


@login_required
def run_certificate(request: HttpRequest, slug: str, kind: str) -> HttpResponse:
    """The signed-in volunteer's own certificate for the run: there is no way to ask for anyone
    else's, so no one downloads another volunteer's certificate."""
    run = visible_run_or_404(request, slug)
    certificate = certificate_for(user=request.user, run=run)
    if certificate is None:
        raise Http404("you have no confirmed credit in this run yet; a certificate states confirmed work only")
    facts = certificate_facts(certificate)
    verify_url = request.build_absolute_uri(reverse("certificate-verify", args=[certificate.code]))
    if kind == "svg":
        body = certificate_svg(facts, verify_url).encode()
    else:
        body = certificate_png(facts, verify_url)
    response = HttpResponse(body, content_type=CONTENT_TYPES[kind])
    response["Content-Disposition"] = f'attachment; filename="{run.slug}-certificate.{kind}"'
    response["Cache-Control"] = "private, no-store"
    return response


def certificate_verify(request: HttpRequest, code: str) -> HttpResponse:
    """What a certificate states, recomputed from the board now. A code no certificate has, one of
    a hidden volunteer, or of a run the viewer may not see reads the same: nothing to verify (a
    hidden volunteer's certificate is not revealed to exist)."""
    certificate = None
    if CODE.fullmatch(code):
        certificate = Certificate.objects.select_related("run", "user").filter(code=code).first()
    if certificate is not None:
        owner = request.user.is_authenticated and request.user.pk == certificate.user_id
        shown = owner or (certificate.user.visibility != User.Visibility.HIDDEN
                          and run_may_view(run=certificate.run, user=request.user))
        certificate = certificate if shown else None
    if certificate is None:
        return render(request, "runs/certificate_verify.html", {"facts": None}, status=404)
    return render(request, "runs/certificate_verify.html", {"facts": certificate_facts(certificate)})
