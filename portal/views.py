from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from portal.errors import error_response
from runs.access.rules import run_list_public


def home(request: HttpRequest) -> HttpResponse:
    return render(request, "home.html", {"runs": run_list_public()[:20]})


def api_not_found(request: HttpRequest) -> JsonResponse:
    return error_response(404, "not_found", f"no API endpoint at {request.path}; see /api/v1/docs")
