from django.http import HttpRequest
from ninja import Router, Schema

from accounts.auth import AgentBearer
from accounts.selectors import volunteer_public_profile
from portal.errors import answers

router = Router(tags=["volunteers"])


class TeamOut(Schema):
    name: str
    slug: str


class MeOut(Schema):
    username: str
    public_name: str | None
    visibility: str
    team: TeamOut | None
    token_name: str
    token_run: str | None
    token_expires_at: str


@router.get("/me", response=answers(MeOut, 401, 403, 429), auth=AgentBearer(), summary="The agent token's owner")
def me(request: HttpRequest):
    """Lets an agent check its token: who owns it, which run it is limited to, when it expires."""
    return volunteer_public_profile(token=request.auth)
