"""Authentication of peer agents by `Authorization: Bearer <agent token>`."""

from django.http import HttpRequest
from ninja.security import HttpBearer

from accounts.models import AgentToken
from accounts.services import AgentTokenRefused, token_authenticate


def request_ip(request: HttpRequest) -> str | None:
    # REMOTE_ADDR is the proxy in production; SECURE_PROXY_SSL_HEADER deployments set it right
    # with the proxy's real-IP module rather than trusting a client-supplied header here.
    return request.META.get("REMOTE_ADDR") or None


def bearer_secret(header: str | None) -> str | None:
    """The secret in an `Authorization` header value, or None when there is none."""
    if not header:
        return None
    scheme, _, secret = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        raise AgentTokenRefused("token_malformed", "use 'Authorization: Bearer <agent token>'")
    return secret.strip() or None


class AgentBearer(HttpBearer):
    """Ninja auth that accepts only a usable agent token and says precisely why it refuses one."""

    def __call__(self, request: HttpRequest) -> AgentToken:
        secret = bearer_secret(request.headers.get("Authorization"))
        return self.authenticate(request, secret)

    def authenticate(self, request: HttpRequest, token: str | None) -> AgentToken:
        return token_authenticate(secret=token, ip=request_ip(request))
