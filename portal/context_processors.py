from django.http import HttpRequest


def site(request: HttpRequest) -> dict:
    # The address the visitor reached us at is the one their agent should use too.
    return {"PORTAL_URL": request.build_absolute_uri("/").rstrip("/")}
