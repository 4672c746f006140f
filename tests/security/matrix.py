"""The security policy as tables (tests/security/test_permission_matrix.py checks every route
against them; test_csrf.py and test_websocket_matrix.py read them too).

PAGES: browser routes with a session cookie. API: the JSON API with an agent token
(`Authorization: Bearer`). Each row is `(path, method, expected status per persona)`; `{public}`
and `{invite}` in a path are a public run and an invite-only run, both active and organized by
olga; `{members}` an invite-only run of olga's that only its members see (vik; bruno is banned
from it): whoever may not see a run gets, on every route, the 404 of a run that does not exist,
and only who sees it but may not act on it a 403. A route of the URL conf with no row here fails
`test_every_route_has_a_row`, so adding a route means adding its row here (one line per method and
run).
"""

from django.core.files.base import ContentFile

L = "login"  # 302 to the log-in page
A = "admin-login"  # 302 to the admin's log-in page

# The personas of tests/security/conftest.py's `world`.
PERSONAS = ["anonymous", "oscar", "vik", "bruno", "olga", "otto", "stella"]

PAGES = [
    # path                                       method  anon  oscar  vik   bruno  olga  otto  stella
    ("/",                                         "GET",  200,  200,   200,  200,   200,  200,  200),
    ("/accounts/login/",                          "GET",  200,  200,   200,  200,   200,  200,  200),
    ("/accounts/login/",                          "POST", 200,  200,   200,  200,   200,  200,  200),
    ("/accounts/logout/",                         "POST", 302,  302,   302,  302,   302,  302,  302),
    ("/accounts/signup/",                         "GET",  200,  302,   302,  302,   302,  302,  302),
    ("/accounts/signup/",                         "POST", 200,  302,   302,  302,   302,  302,  302),
    ("/accounts/signup/sent/",                    "GET",  200,  200,   200,  200,   200,  200,  200),
    # The mailed link is the credential, whoever's session opens it: it creates the account and logs it in.
    ("/accounts/signup/confirm/{signup}/",        "GET",  200,  200,   200,  200,   200,  200,  200),
    ("/accounts/signup/confirm/{signup}/",        "POST", 302,  302,   302,  302,   302,  302,  302),
    ("/accounts/profile/",                        "GET",  L,    200,   200,  200,   200,  200,  200),
    ("/accounts/profile/",                        "POST", L,    200,   200,  200,   200,  200,  200),
    ("/accounts/password_change/",                "GET",  L,    200,   200,  200,   200,  200,  200),
    ("/accounts/password_change/",                "POST", L,    200,   200,  200,   200,  200,  200),
    ("/accounts/password_change/done/",           "GET",  L,    200,   200,  200,   200,  200,  200),
    ("/accounts/password_reset/",                 "GET",  200,  200,   200,  200,   200,  200,  200),
    ("/accounts/password_reset/",                 "POST", 302,  302,   302,  302,   302,  302,  302),
    ("/accounts/password_reset/done/",            "GET",  200,  200,   200,  200,   200,  200,  200),
    ("/accounts/reset/MQ/bad-token/",             "GET",  200,  200,   200,  200,   200,  200,  200),
    ("/accounts/reset/done/",                     "GET",  200,  200,   200,  200,   200,  200,  200),
    ("/accounts/verify/resend/",                  "POST", L,    302,   302,  302,   302,  302,  302),
    ("/accounts/verify/{vik_verify}/",            "GET",  L,    L,     302,  L,     L,    L,    L),
    ("/accounts/verify/forged-link/",             "GET",  400,  400,   400,  400,   400,  400,  400),
    ("/notifications/",                           "GET",  L,    200,   200,  200,   200,  200,  200),
    ("/notifications/read/",                      "POST", L,    302,   302,  302,   302,  302,  302),
    ("/notifications/unsubscribe/{vik_unsubscribe}/", "GET", 200, 200, 200,  200,   200,  200,  200),
    ("/notifications/unsubscribe/{vik_unsubscribe}/", "POST", 200, 200, 200, 200,   200,  200,  200),
    ("/notifications/unsubscribe/forged-link/",   "GET",  400,  400,   400,  400,   400,  400,  400),
    ("/tokens/",                                  "GET",  L,    200,   200,  200,   200,  200,  200),
    ("/tokens/",                                  "POST", L,    200,   200,  200,   200,  200,  200),
    ("/tokens/{vik_token}/revoke/",               "POST", L,    404,   302,  404,   404,  404,  404),
    ("/teams/",                                   "GET",  200,  200,   200,  200,   200,  200,  200),
    ("/teams/new/",                               "GET",  L,    200,   200,  200,   200,  200,  200),
    ("/teams/new/",                               "POST", L,    302,   200,  302,   302,  302,  302),
    ("/teams/{team}/",                            "GET",  200,  200,   200,  200,   200,  200,  200),
    ("/teams/{team}/join/",                       "POST", L,    302,   302,  302,   302,  302,  302),
    ("/teams/{team}/leave/",                      "POST", L,    302,   302,  302,   302,  302,  302),
    ("/teams/{team}/hand-over/",                  "POST", L,    302,   302,  302,   302,  302,  302),
    ("/teams/{team}/disband/",                    "POST", L,    302,   302,  302,   302,  302,  302),
    ("/runs/new/",                                "GET",  L,    403,   403,  403,   200,  200,  200),
    ("/runs/new/",                                "POST", L,    403,   403,  403,   200,  200,  200),
    ("/runs/{public}/",                           "GET",  200,  200,   200,  200,   200,  200,  200),
    ("/runs/{invite}/",                           "GET",  200,  200,   200,  200,   200,  200,  200),
    ("/runs/{public}/join/",                      "GET",  L,    200,   200,  200,   200,  200,  200),
    ("/runs/{invite}/join/",                      "GET",  L,    200,   200,  200,   200,  200,  200),
    ("/runs/{public}/join/",                      "POST", L,    200,   200,  200,   200,  200,  200),
    ("/runs/{invite}/join/",                      "POST", L,    200,   200,  200,   200,  200,  200),
    # The join notebook holds no secret (the token is asked for when it runs): whoever may see the run gets it.
    ("/runs/{public}/join/notebook.ipynb",        "GET",  200,  200,   200,  200,   200,  200,  200),
    ("/runs/{invite}/join/notebook.ipynb",        "GET",  200,  200,   200,  200,   200,  200,  200),
    ("/runs/{public}/edit/",                      "GET",  L,    403,   403,  403,   200,  403,  403),
    ("/runs/{invite}/edit/",                      "POST", L,    403,   403,  403,   200,  403,  403),
    ("/runs/{public}/participants/",              "GET",  L,    403,   403,  403,   200,  403,  403),
    ("/runs/{invite}/participants/",              "GET",  L,    403,   403,  403,   200,  403,  403),
    ("/runs/{public}/ban/",                       "POST", L,    403,   403,  403,   302,  403,  403),
    ("/runs/{public}/unban/",                     "POST", L,    403,   403,  403,   302,  403,  403),
    ("/runs/{invite}/allowlist/",                 "POST", L,    403,   403,  403,   302,  403,  403),
    ("/runs/{invite}/data/",                      "POST", L,    403,   403,  403,   302,  403,  403),
    ("/runs/{invite}/data/{data_file}/remove/",   "POST", L,    403,   403,  403,   302,  403,  403),
    ("/runs/{public}/tokenizer/train/",           "POST", L,    403,   403,  403,   302,  403,  403),
    ("/runs/{public}/tokenizer/upload/",          "POST", L,    403,   403,  403,   302,  403,  403),
    ("/runs/{public}/status/pause/",              "POST", L,    403,   403,  403,   302,  403,  403),
    ("/runs/{invite}/status/finish/",             "POST", L,    403,   403,  403,   302,  403,  403),
    ("/runs/{public}/status/pause/",              "GET",  405,  405,   405,  405,   405,  405,  405),
    ("/runs/{public}/health/",                    "GET",  200,  200,   200,  200,   200,  200,  200),
    ("/runs/{invite}/health/",                    "GET",  200,  200,   200,  200,   200,  200,  200),
    ("/runs/{public}/checkpoints/epoch-3.zip",    "GET",  200,  200,   200,  200,   200,  200,  200),
    ("/runs/{invite}/checkpoints/epoch-3.zip",    "GET",  404,  404,   200,  404,   200,  404,  200),
    ("/runs/{public}/probes/",                    "GET",  L,    403,   403,  403,   200,  403,  403),
    ("/runs/{public}/probes/",                    "POST", L,    403,   403,  403,   400,  403,  403),
    ("/runs/{public}/probes/{probe}/remove/",     "POST", L,    403,   403,  403,   302,  403,  403),
    ("/runs/{public}/flags/",                     "GET",  L,    403,   403,  403,   200,  403,  200),
    ("/runs/{public}/flags/{flag}/accept/",       "POST", L,    403,   403,  403,   302,  403,  302),
    ("/runs/{public}/flags/{flag}/reject/",       "GET",  405,  405,   405,  405,   405,  405,  405),
    ("/runs/{public}/suspended/{public_session}/lift/", "POST", L, 403,   403,  403,   302,  403,  302),
    # The members-only run: every organizer route, and the pages its members see.
    ("/runs/{members}/",                          "GET",  404,  404,   200,  404,   200,  404,  200),
    ("/runs/{members}/join/",                     "GET",  L,    404,   200,  404,   200,  404,  200),
    ("/runs/{members}/join/notebook.ipynb",       "GET",  404,  404,   200,  404,   200,  404,  200),
    ("/runs/{members}/edit/",                     "GET",  L,    404,   403,  404,   200,  404,  403),
    ("/runs/{members}/edit/",                     "POST", L,    404,   403,  404,   200,  404,  403),
    ("/runs/{members}/participants/",             "GET",  L,    404,   403,  404,   200,  404,  403),
    ("/runs/{members}/ban/",                      "POST", L,    404,   403,  404,   302,  404,  403),
    ("/runs/{members}/unban/",                    "POST", L,    404,   403,  404,   302,  404,  403),
    ("/runs/{members}/allowlist/",                "POST", L,    404,   403,  404,   302,  404,  403),
    ("/runs/{members}/data/",                     "POST", L,    404,   403,  404,   302,  404,  403),
    ("/runs/{members}/data/{members_data_file}/remove/", "POST", L, 404, 403,  404,   302,  404,  403),
    ("/runs/{members}/tokenizer/train/",          "POST", L,    404,   403,  404,   302,  404,  403),
    ("/runs/{members}/tokenizer/upload/",         "POST", L,    404,   403,  404,   302,  404,  403),
    ("/runs/{members}/status/pause/",             "POST", L,    404,   403,  404,   302,  404,  403),
    ("/runs/{members}/status/pause/",             "GET",  405,  405,   405,  405,   405,  405,  405),
    ("/runs/{members}/probes/",                   "GET",  L,    404,   403,  404,   200,  404,  403),
    ("/runs/{members}/probes/",                   "POST", L,    404,   403,  404,   400,  404,  403),
    ("/runs/{members}/probes/{members_probe}/remove/", "POST", L, 404, 403,  404,   302,  404,  403),
    ("/runs/{members}/flags/",                    "GET",  L,    404,   403,  404,   200,  404,  200),
    ("/runs/{members}/flags/{members_flag}/accept/", "POST", L,  404,  403,  404,   302,  404,  302),
    ("/runs/{members}/suspended/{members_session}/lift/", "POST", L, 404, 403, 404,  302,  404,  302),
    ("/leaderboard/",                             "GET",  200,  200,   200,  200,   200,  200,  200),
    ("/runs/{public}/certificate.svg",            "GET",  L,    404,   200,  404,   404,  404,  404),
    ("/runs/{invite}/certificate.png",            "GET",  L,    404,   404,  404,   404,  404,  404),
    ("/certificates/{vik_certificate}/",          "GET",  200,  200,   200,  200,   200,  200,  200),
    ("/certificates/forged0000000000000000/",     "GET",  404,  404,   404,  404,   404,  404,  404),
    ("/runs/",                                    "GET",  200,  200,   200,  200,   200,  200,  200),
    ("/i18n/setlang/",                            "POST", 302,  302,   302,  302,   302,  302,  302),
    ("/jsi18n/",                                  "GET",  200,  200,   200,  200,   200,  200,  200),
    ("/stats/",                                   "GET",  200,  200,   200,  200,   200,  200,  200),
    ("/stats/2026-01-01/users.json.gz",           "GET",  404,  404,   404,  404,   404,  404,  404),
    ("/volunteers/{vik}/",                        "GET",  200,  200,   200,  200,   200,  200,  200),
    ("/agent/",                                   "GET",  200,  200,   200,  200,   200,  200,  200),
    ("/agent/{wheel}",                            "GET",  200,  200,   200,  200,   200,  200,  200),
    ("/admin/",                                   "GET",  A,    A,     A,    A,     A,    A,    200),
    ("/admin/runs/run/",                          "GET",  A,    A,     A,    A,     A,    A,    200),
    ("/api/v2/runs/",                             "GET",  404,  404,   404,  404,   404,  404,  404),
]

# The API's personas hold agent tokens: each of the seven above (anonymous sends none), plus a
# revoked token of vik's and a token of vik's limited to another run.
TOKEN_PERSONAS = [*PERSONAS, "revoked", "elsewhere"]

API = [
    # path                                           method  anon oscar vik  bruno olga otto stella revoked elsewhere
    ("/api/v1/openapi.json",                         "GET",  200, 200,  200, 200,  200, 200, 200,   200,    200),
    ("/api/v1/docs",                                 "GET",  200, 200,  200, 200,  200, 200, 200,   200,    200),
    ("/api/v1/",                                     "GET",  404, 404,  404, 404,  404, 404, 404,   404,    404),
    ("/api/v1/me",                                   "GET",  401, 200,  200, 200,  200, 200, 200,   401,    200),
    ("/api/v1/runs/",                                "GET",  200, 200,  200, 200,  200, 200, 200,   200,    200),
    ("/api/v1/runs/{public}/",                       "GET",  200, 200,  200, 200,  200, 200, 200,   200,    200),
    ("/api/v1/runs/{invite}/",                       "GET",  200, 200,  200, 200,  200, 200, 200,   200,    200),
    ("/api/v1/runs/{public}/join",                   "POST", 401, 200,  200, 403,  200, 200, 200,   401,    403),
    ("/api/v1/runs/{invite}/join",                   "POST", 401, 403,  200, 403,  200, 403, 403,   401,    403),
    # Joining as an aggregator (JoinRequest.role): the run's organizers only, staff and other runs' organizers included.
    ("/api/v1/runs/{public}/join?role=aggregator",   "POST", 401, 403,  403, 403,  200, 403, 403,   401,    403),
    ("/api/v1/runs/{invite}/join?role=aggregator",   "POST", 401, 403,  403, 403,  200, 403, 403,   401,    403),
    ("/api/v1/sessions/{public_session}/refresh",    "POST", 401, 404,  200, 404,  404, 404, 404,   401,    403),
    ("/api/v1/sessions/{invite_session}/refresh",    "POST", 401, 404,  200, 404,  404, 404, 404,   401,    403),
    ("/api/v1/sessions/{public_session}/credit",     "GET",  401, 404,  200, 404,  404, 404, 404,   401,    403),
    ("/api/v1/sessions/{invite_session}/credit",     "GET",  401, 404,  200, 404,  404, 404, 404,   401,    403),
    ("/api/v1/runs/{public}/tokenizer.json",         "GET",  401, 200,  200, 403,  200, 200, 200,   401,    403),
    ("/api/v1/runs/{invite}/tokenizer.json",         "GET",  401, 403,  200, 403,  200, 403, 403,   401,    403),
    ("/api/v1/data/{invite_data_link}",              "GET",  200, 200,  200, 200,  200, 200, 200,   200,    200),
    ("/api/v1/probe/download",                       "GET",  401, 200,  200, 200,  200, 200, 200,   401,    200),
    ("/api/v1/probe/upload",                         "POST", 401, 200,  200, 200,  200, 200, 200,   401,    200),
    ("/api/v1/runs/{public}/leaderboard",            "GET",  200, 200,  200, 200,  200, 200, 200,   200,    200),
    ("/api/v1/runs/{invite}/leaderboard",            "GET",  200, 200,  200, 200,  200, 200, 200,   200,    200),
    ("/api/v1/runs/{public}/checkpoints",            "GET",  200, 200,  200, 200,  200, 200, 200,   200,    200),
    ("/api/v1/runs/{invite}/checkpoints",            "GET",  404, 404,  404, 404,  404, 404, 404,   404,    404),
    ("/api/v1/checkpoints/{invite_checkpoint_link}", "GET",  200, 200,  200, 200,  200, 200, 200,   200,    200),
    ("/api/v1/leaderboard",                          "GET",  200, 200,  200, 200,  200, 200, 200,   200,    200),
    ("/api/v1/stats",                                "GET",  200, 200,  200, 200,  200, 200, 200,   200,    200),
    ("/api/v1/volunteers/{vik}/contributions",       "GET",  200, 200,  200, 200,  200, 200, 200,   200,    200),
    ("/api/v1/runs/{public}/series",                 "GET",  200, 200,  200, 200,  200, 200, 200,   200,    200),
    ("/api/v1/runs/{invite}/series",                 "GET",  200, 200,  200, 200,  200, 200, 200,   200,    200),
    ("/api/v1/runs/{public}/evaluations",            "GET",  200, 200,  200, 200,  200, 200, 200,   200,    200),
    ("/api/v1/runs/{invite}/evaluations",            "GET",  200, 200,  200, 200,  200, 200, 200,   200,    200),
    ("/api/v1/runs/{public}/probes",                 "GET",  200, 200,  200, 200,  200, 200, 200,   200,    200),
    ("/api/v1/runs/{invite}/probes",                 "GET",  200, 200,  200, 200,  200, 200, 200,   200,    200),
]

# What a POST carries, by path template; a POST whose path is not here sends an empty form.
FORMS = {
    "/accounts/login/": {"username": "nobody", "password": "wrong"},
    "/accounts/password_reset/": {"email": "someone@example.org"},
    "/tokens/": {"name": "laptop", "lifetime_days": 30},
    "/notifications/read/": {"all": "1"},
    "/teams/new/": {"name": "Sylhet Compute"},
    "/i18n/setlang/": {"language": "bn", "next": "/runs/"},
    "/runs/{public}/join/": {"action": "token"},
    "/runs/{invite}/join/": {"action": "token"},
    "/runs/{public}/ban/": {"username": "oscar"},
    "/runs/{members}/ban/": {"username": "oscar"},
    "/runs/{members}/unban/": {"username": "bruno"},
    "/runs/{members}/allowlist/": {"usernames": "vik"},
    "/runs/{members}/data/": {"file": lambda: ContentFile(b"one line of text\n", name="more.txt")},
    "/runs/{public}/unban/": {"username": "bruno"},
    "/runs/{invite}/allowlist/": {"usernames": "vik"},
    "/runs/{invite}/data/": {"file": lambda: ContentFile(b"one line of text\n", name="more.txt")},
}


def post_data(template: str) -> dict:
    return {key: value() if callable(value) else value for key, value in FORMS.get(template, {}).items()}

# POSTs that take no CSRF token, and why: the signed link in a notification e-mail is the credential
# (never the session cookie), and mail clients' one-click unsubscribe (RFC 8058) posts without one.
CSRF_EXEMPT = {"/notifications/unsubscribe/{vik_unsubscribe}/"}
