"""Settings for DeDLOC Portal, all read from the environment.

The defaults run with nothing installed: a SQLite file, the in-memory channel layer, a Celery
broker kept in files, console e-mail and DEBUG on. `DATABASE_URL` and `REDIS_URL` switch to
PostgreSQL and Redis; see docs/deploy.md for production.
"""

import os
from pathlib import Path

import dj_database_url
from celery.schedules import crontab
from csp.constants import NONE, SELF
from django.core.exceptions import ImproperlyConfigured

from portal.env import env_bool, env_choice, env_int, env_list, env_networks, env_rate, env_str

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("PORTAL_VAR_DIR", str(BASE_DIR / "var")))
VAR_DIR.mkdir(parents=True, exist_ok=True)  # the SQLite file, the file broker and media live here

DEBUG = env_bool("DEBUG", True)
_DEV_SECRET = "dev-only-insecure-secret-key-change-me-in-production-0123456789"
SECRET_KEY = env_str("SECRET_KEY", _DEV_SECRET)
if not DEBUG and SECRET_KEY == _DEV_SECRET:
    raise ImproperlyConfigured("SECRET_KEY must be set when DEBUG is off")
# Encrypts the run authorities' private keys at rest; kept apart from SECRET_KEY so that
# rotating session signing does not lose the runs' hivemind identities.
AUTHORITY_ENCRYPTION_KEY = env_str("AUTHORITY_ENCRYPTION_KEY", SECRET_KEY)

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])
SITE_URL = env_str("SITE_URL", "http://127.0.0.1:8000").rstrip("/")

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "channels",
    "ninja",
    "accounts",
    "runs",
]

MIDDLEWARE = [
    "portal.logs.request_id_middleware",  # first, so that every log line of a request carries its id
    "portal.health.HealthProbeMiddleware",  # /healthz and /readyz, ahead of the host check and HTTPS redirect
    "portal.scrape.MetricsMiddleware",  # /metrics for Prometheus, likewise; times every other request
    "django.middleware.security.SecurityMiddleware",
    "csp.middleware.CSPMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    # After sessions, before common: picks the reader's language from the switcher's cookie or the browser.
    "django.middleware.locale.LocaleMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "portal.urls"
ASGI_APPLICATION = "portal.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "portal.context_processors.site",
                "accounts.context_processors.notifications",
            ],
        },
    },
]

# --- storage -----------------------------------------------------------------------------------

DATABASE_URL = env_str("DATABASE_URL", f"sqlite:///{VAR_DIR / 'portal.sqlite3'}")
if DATABASE_URL.split(":", 1)[0] not in {"sqlite", "postgres", "postgresql"}:
    raise ImproperlyConfigured(f"DATABASE_URL={DATABASE_URL!r}: only sqlite:// and postgres:// are supported")
DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=env_int("DB_CONN_MAX_AGE", 0, minimum=0))}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Several processes (web, worker, coordinator) share the file in the embedded default.
    DATABASES["default"]["OPTIONS"] = {"timeout": 20, "transaction_mode": "IMMEDIATE", "init_command": "PRAGMA journal_mode=WAL;"}
    # Tests serve the portal from threads while agents report: an in-memory test database uses
    # SQLite's shared cache, whose table locks fail at once instead of waiting out `timeout`.
    # One file per test process, so that two test runs in one checkout never share it.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / f"test-{os.getpid()}.sqlite3")}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
AUTH_USER_MODEL = "accounts.User"

REDIS_URL = env_str("REDIS_URL", "")
if REDIS_URL and not REDIS_URL.startswith(("redis://", "rediss://", "unix://")):
    raise ImproperlyConfigured(f"REDIS_URL={REDIS_URL!r} must start with redis://, rediss:// or unix://")

if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            # redis-py caps an async pool at 100 connections; many viewers need more (docs/design.md).
            "CONFIG": {"hosts": [{"address": REDIS_URL, "max_connections": env_int("REDIS_MAX_CONNECTIONS", 1000, minimum=10)}]},
        }
    }
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL}}
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

# --- celery ------------------------------------------------------------------------------------

_CELERY_DIR = VAR_DIR / "celery"
if REDIS_URL:
    CELERY_BROKER_URL = REDIS_URL
    CELERY_RESULT_BACKEND = REDIS_URL
else:
    # A broker kept in files: worker, beat and web talk across processes with no server.
    CELERY_BROKER_URL = "filesystem://"
    CELERY_BROKER_TRANSPORT = "portal.broker:Transport"  # kombu's, with messages that appear whole
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_CELERY_DIR / "queue"),
        "data_folder_out": str(_CELERY_DIR / "queue"),
        "processed_folder": str(_CELERY_DIR / "processed"),
        "control_folder": str(_CELERY_DIR / "control"),
        "store_processed": False,
    }
    CELERY_RESULT_BACKEND = None
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_TASK_ACKS_LATE = True
CELERY_BEAT_SCHEDULE_FILENAME = str(_CELERY_DIR / "beat-schedule")
CELERY_TIMEZONE = "UTC"
# Credit and leaderboards (runs/credit/rollup.py): events are rolled up in batches, never counted per report.
CREDIT_ROLLUP_BATCH = env_int("CREDIT_ROLLUP_BATCH", 10000, minimum=1)
# Events younger than this wait for the next pass, so that an insert still committing is never skipped.
CREDIT_ROLLUP_SETTLE_SECONDS = env_int("CREDIT_ROLLUP_SETTLE_SECONDS", 2, minimum=0)
CREDIT_ROLLUP_EVERY_SECONDS = env_int("CREDIT_ROLLUP_EVERY_SECONDS", 10, minimum=1)
# A session that has not reported for this long is closed (its agent crashed or lost the network).
SESSION_SILENT_CLOSE_SECONDS = env_int("SESSION_SILENT_CLOSE_SECONDS", 900, minimum=60)
# Checkpoint evaluation (runs/evaluation/): a child process at low priority with a bounded thread
# count, so that a host that also runs a backbone peer or the web keeps serving them.
EVALUATION_THREADS = env_int("EVALUATION_THREADS", max(1, (os.cpu_count() or 1) // 4), minimum=1)
EVALUATION_NICE = env_int("EVALUATION_NICE", 10, minimum=0)
EVALUATION_TIMEOUT_SECONDS = env_int("EVALUATION_TIMEOUT_SECONDS", 1800, minimum=10)
EVALUATION_EVERY_SECONDS = env_int("EVALUATION_EVERY_SECONDS", 30, minimum=1)
# An evaluation takes minutes (the held-out pass, and each probe fine-tuned from three seeds): it has a
# queue and a worker of its own (docs/deploy.md), so that the credit rollup and e-mails never wait behind one.
CELERY_TASK_ROUTES = {"runs.tasks.evaluations_task": {"queue": "evaluations"},
                      "runs.swarm.recompute.spot_check_task": {"queue": "validations"}}
# Periodic tasks live in each app's tasks.py (found by autodiscovery); a task that a service queues lives
# beside that service, so that the service need not import the tasks module that imports it back.
CELERY_IMPORTS = ["accounts.notifications", "accounts.signup", "accounts.password_reset", "runs.setup.services"]
CELERY_BEAT_SCHEDULE = {
    "evaluations": {"task": "runs.tasks.evaluations_task", "schedule": float(EVALUATION_EVERY_SECONDS)},
    "credit-rollup": {"task": "runs.tasks.credit_rollup_task", "schedule": float(CREDIT_ROLLUP_EVERY_SECONDS)},
    "credit-rac-decay": {"task": "runs.tasks.credit_rac_decay_task", "schedule": 3600.0},
    "sessions-close-silent": {"task": "runs.tasks.sessions_close_silent_task", "schedule": 60.0},
    "pending-expire": {"task": "runs.tasks.pending_expire_task", "schedule": 300.0},
    "stats-dump-daily": {"task": "runs.tasks.stats_dump_task", "schedule": crontab(minute=5, hour=0)},
    "milestones-refresh": {"task": "runs.tasks.milestones_refresh_task", "schedule": 3600.0},
    "tokens-expiring": {"task": "accounts.tasks.tokens_expiring_task", "schedule": 3600.0},
    "notification-emails-pending": {"task": "accounts.tasks.notification_emails_pending_task", "schedule": 600.0},
}

# Spot checks' recomputation (runs/swarm/recompute.py): off, each run's coordinator recomputes in a thread of
# its own; on, it only schedules, and validator workers on any host consume the validations queue
# (docs/deploy.md). A check queued this long ago and not recorded is queued again (its worker was lost).
SPOT_CHECK_WORKERS = env_bool("SPOT_CHECK_WORKERS", False)
SPOT_CHECK_REQUEUE_SECONDS = env_int("SPOT_CHECK_REQUEUE_SECONDS", 1800, minimum=60)
# Each worker consumes a queue of its own too: a validator worker passes a check to the worker that keeps its
# session's stream (runs/swarm/recompute.py, session_worker).
CELERY_WORKER_DIRECT = True

# --- auth --------------------------------------------------------------------------------------

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "home"
AGENT_TOKEN_DEFAULT_DAYS = env_int("AGENT_TOKEN_DEFAULT_DAYS", 90, minimum=1)
# Where a hosted notebook service opens notebooks/join-a-run.ipynb from this portal's repository (e.g. Colab's
# https://colab.research.google.com/github/<owner>/<repo>/blob/main/notebooks/join-a-run.ipynb); the join
# pages link it. Empty: no link (the service must reach the portal, so only a public portal sets it).
JOIN_NOTEBOOK_HOSTED_URL = env_str("JOIN_NOTEBOOK_HOSTED_URL", "")
# Accounts are created from the link mailed at sign-up (accounts/signup.py), and agent tokens need a
# confirmed address (accounts/verification.py). A closed deployment whose accounts staff create can
# turn this off: sign-up then creates the account at once.
ACCOUNT_EMAIL_VERIFICATION_REQUIRED = env_bool("ACCOUNT_EMAIL_VERIFICATION_REQUIRED", True)
EMAIL_VERIFICATION_DAYS = env_int("EMAIL_VERIFICATION_DAYS", 3, minimum=1)
# Notification e-mails per volunteer per hour (accounts/notifications.py); past it the bell still rings.
NOTIFICATION_EMAILS_PER_HOUR = env_int("NOTIFICATION_EMAILS_PER_HOUR", 5, minimum=0)
# Revocation and bans act by refusing refreshes, so hivemind access tokens are short-lived.
HIVEMIND_ACCESS_MINUTES = env_int("HIVEMIND_ACCESS_MINUTES", 30, minimum=1)
# Agents training at once on one agent token, and for one volunteer across their tokens.
AGENT_TOKEN_MAX_LIVE_SESSIONS = env_int("AGENT_TOKEN_MAX_LIVE_SESSIONS", 8, minimum=1)
VOLUNTEER_MAX_LIVE_SESSIONS = env_int("VOLUNTEER_MAX_LIVE_SESSIONS", 32, minimum=1)
# Open agent sockets per token (an agent holds one; reconnects overlap briefly): across all web processes
# with REDIS_URL, where a killed process's sockets stop counting within the lease (runs/ingest/token_sockets.py).
AGENT_TOKEN_MAX_SOCKETS = env_int("AGENT_TOKEN_MAX_SOCKETS", 16, minimum=1)
AGENT_SOCKET_LEASE_SECONDS = env_int("AGENT_SOCKET_LEASE_SECONDS", 30, minimum=3)
# Where the contribution certificates' PNG looks for its fonts (runs/credit/certificates.py).
CERTIFICATE_FONT_DIRS = env_list("CERTIFICATE_FONT_DIRS", ["/usr/share/fonts", "/usr/local/share/fonts"])
DATA_URL_MAX_AGE_SECONDS = env_int("DATA_URL_MAX_AGE_SECONDS", 7 * 24 * 3600, minimum=60)
# The coordinator's backbone peers: where they listen, the addresses they announce, their identities.
COORDINATOR_HOST_MADDRS = env_list("COORDINATOR_HOST_MADDRS", ["/ip4/127.0.0.1/tcp/0"])
COORDINATOR_ANNOUNCE_MADDRS = env_list("COORDINATOR_ANNOUNCE_MADDRS", [])
COORDINATOR_STATE_DIR = env_str("COORDINATOR_STATE_DIR", str(VAR_DIR / "coordinator"))
# A backbone peer whose coordinator has not beaten for this long is taken for dead: joins are not
# pointed at it and the health page says so. It beats every cycle (5 s by default, plus a monitor poll
# of at most 10 s).
COORDINATOR_HEARTBEAT_STALE_SECONDS = env_int("COORDINATOR_HEARTBEAT_STALE_SECONDS", 30, minimum=2)
# With several backbone peers per run (docs/deploy.md), the one holding the run's duties (monitor,
# checkpoints, spot checks) renews its hold before each duty; another takes them over once it lapses.
# Longer than one duty takes (a checkpoint downloads the whole state), shorter than an organizer
# would go without a monitor reading after a host died.
COORDINATOR_DUTIES_LEASE_SECONDS = env_int("COORDINATOR_DUTIES_LEASE_SECONDS", 180, minimum=2)
# A run whose organizers turned on `averaging.backbone_aggregates`: each backbone peer also runs an
# aggregator (peer_agent/aggregator.py), a second peer on this host that listens here and declares this
# upload bandwidth to the partition (the host's link, which the coordinator does not measure itself).
COORDINATOR_AGGREGATOR_HOST_MADDRS = env_list("COORDINATOR_AGGREGATOR_HOST_MADDRS", ["/ip4/127.0.0.1/tcp/0"])
COORDINATOR_AGGREGATOR_ANNOUNCE_MADDRS = env_list("COORDINATOR_AGGREGATOR_ANNOUNCE_MADDRS", [])
COORDINATOR_AGGREGATOR_BANDWIDTH_MBPS = env_int("COORDINATOR_AGGREGATOR_BANDWIDTH_MBPS", 100, minimum=1)
# The largest files organizers upload: a run's text file (the largest), its tokenizer.json, and each
# part of a downstream probe (docs/organizers.md "Probes").
DATA_FILE_MAX_BYTES = 50 * 1024 * 1024
TOKENIZER_MAX_BYTES = 20 * 1024 * 1024
PROBE_MAX_FILE_BYTES = env_int("PROBE_MAX_FILE_BYTES", 10 * 1024 * 1024, minimum=1024)
# The only folder on this server whose models an organizer may start a run from (runs/setup/start.py):
# a run's form reads any path an organizer types, so it must not reach the rest of the disk. Hugging
# Face models the form downloads are cached under it too.
START_MODELS_DIR = Path(env_str("START_MODELS_DIR", str(VAR_DIR / "models")))
# A request's fields other than files (a form's, a JSON body's): the largest, a run's settings form,
# is a few KiB.
DATA_UPLOAD_MAX_MEMORY_SIZE = 1024 * 1024
# Past this an uploaded file, and under ASGI any request body, waits in a temporary file, not in memory.
FILE_UPLOAD_MAX_MEMORY_SIZE = 5 * 1024 * 1024
# A request body larger than the largest upload with the rest of its form is answered 413 before it is
# read (portal/request_body.py); the proxy in front takes no more either (docs/deploy.md, "The proxy").
REQUEST_BODY_MAX_BYTES = max(DATA_FILE_MAX_BYTES, TOKENIZER_MAX_BYTES, 2 * PROBE_MAX_FILE_BYTES) + DATA_UPLOAD_MAX_MEMORY_SIZE
# `manage.py publish_checkpoint --hub REPO` uploads with this Hugging Face token; without one it refuses.
HF_TOKEN = env_str("HF_TOKEN", "")

# --- Prometheus metrics (portal/scrape.py, docs/deploy.md "Metrics") ------------------------------
# Who may read /metrics: a scraper with this bearer token, or one from these networks; nobody when neither is set.
METRICS_TOKEN = env_str("METRICS_TOKEN", "")
METRICS_ALLOWED_NETWORKS = env_networks("METRICS_ALLOWED_NETWORKS")
# prometheus_client's own variable: the folder where every process keeps its counters (multiprocess mode).
_multiproc_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
if _multiproc_dir and not os.path.isdir(_multiproc_dir):
    raise ImproperlyConfigured(f"PROMETHEUS_MULTIPROC_DIR={_multiproc_dir!r} is not a folder; create it (empty) first")

# --- rate limits (COUNT/WINDOW, counted in the cache; portal/ratelimit.py) -----------------------

RATE_LIMITS = {
    "login": env_rate("RATE_LIMIT_LOGIN", "10/15m"),  # per client IP and username
    # Per client IP, whatever the username: one password tried against many accounts. Higher than
    # "login" because a lab or a campus may share one address.
    "login_address": env_rate("RATE_LIMIT_LOGIN_ADDRESS", "50/15m"),
    "signup": env_rate("RATE_LIMIT_SIGNUP", "10/1h"),  # per client IP
    "signup_email": env_rate("RATE_LIMIT_SIGNUP_EMAIL", "3/1h"),  # sign-up mails per address mailed, silently past it
    "token_create": env_rate("RATE_LIMIT_TOKEN_CREATE", "30/1h"),  # per volunteer
    "verify_resend": env_rate("RATE_LIMIT_VERIFY_RESEND", "5/1h"),  # verification e-mails, per volunteer
    # Password reset mails: per client IP that asks, and per address mailed (silently past it, so
    # that the page never tells anything about an address).
    "reset_client": env_rate("RATE_LIMIT_RESET_CLIENT", "10/1h"),
    "reset_email": env_rate("RATE_LIMIT_RESET_EMAIL", "3/1h"),
    "join": env_rate("RATE_LIMIT_JOIN", "60/10m"),  # per agent token
    # Per agent token. An agent holds two copies of its hivemind access, the DHT process's and the one
    # that signs its averaging membership proofs (peer_agent/averaging.py), and each is refreshed once
    # two thirds of its lifetime have passed (peer_agent/authorizer.py): up to 2 refreshes per copy,
    # 4 per machine, in one window of a lifetime. 30 leaves room for seven machines on one agent token
    # (one machine per token is the rule).
    "refresh": env_rate("RATE_LIMIT_REFRESH", f"30/{HIVEMIND_ACCESS_MINUTES}m"),
    # Per client IP: refused agent tokens (unknown, malformed, revoked, expired). Guessing a token is
    # hopeless anyway (256 random bits); this keeps guessers from loading the database.
    "token_failures": env_rate("RATE_LIMIT_TOKEN_FAILURES", "100/1h"),
}
# An agent's contribution reports, per websocket connection (a token bucket in runs/ingest/consumers.py).
REPORT_RATE_PER_SECOND = env_int("REPORT_RATE_PER_SECOND", 5, minimum=1)
REPORT_RATE_BURST = env_int("REPORT_RATE_BURST", 50, minimum=1)

# --- e-mail ------------------------------------------------------------------------------------

EMAIL_BACKEND = env_str("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
EMAIL_HOST = env_str("EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("EMAIL_PORT", 25, minimum=1)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "DeDLOC Portal <noreply@localhost>")

# --- static and media --------------------------------------------------------------------------

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(env_str("STATIC_ROOT", str(BASE_DIR / "staticfiles")))
MEDIA_URL = "media/"
MEDIA_ROOT = Path(env_str("MEDIA_ROOT", str(VAR_DIR / "media")))
# Serve files straight from the static folders too, so that the demo and the tests (their settings
# read with DEBUG on, the default) need no collectstatic. With DEBUG off pages link the compressed,
# hashed copies collectstatic writes, and the web process does not start without them
# (portal/static_manifest.py).
WHITENOISE_USE_FINDERS = True
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"
        if DEBUG
        else "whitenoise.storage.CompressedManifestStaticFilesStorage"
    },
}

# --- HTTPS and cookies -------------------------------------------------------------------------

SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", False)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", not DEBUG)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", not DEBUG)
if env_bool("USE_X_FORWARDED_PROTO", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
X_FRAME_OPTIONS = "DENY"
# Django's defaults, stated so that a reader sees them (tests/security/test_xss_and_headers.py).
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
# Pages run only the portal's own script files (no inline script, handler or style attribute), load
# nothing from elsewhere, and open sockets only to the portal: an injected tag that escaped escaping
# still does nothing. The browser tests fail on any violation (tests/browser/steps.py, csp_violations).
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF], "script-src": [SELF], "style-src": [SELF], "img-src": [SELF, "data:"],
        "font-src": [SELF], "connect-src": [SELF], "object-src": [NONE], "base-uri": [NONE],
        "form-action": [SELF], "frame-ancestors": [NONE],
    },
}

LANGUAGE_CODE = "en"
# The languages the interface is translated into (locale/, `make messages`); the switcher in the
# page footer offers these and remembers the choice in a cookie for a year.
LANGUAGES = [("en", "English"), ("bn", "বাংলা")]
LOCALE_PATHS = [BASE_DIR / "locale"]
FORMAT_MODULE_PATH = ["portal.formats"]
LANGUAGE_COOKIE_AGE = 365 * 24 * 3600
LANGUAGE_COOKIE_SAMESITE = "Lax"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

# LOG_FORMAT=json: one JSON object a line, with the request id, run and session where known (portal/logs.py).
LOG_FORMAT = env_choice("LOG_FORMAT", "plain", {"plain", "json"})
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"context": {"()": "portal.logs.LogContext"}},
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
        "json": {"()": "portal.logs.json_formatter"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT, "filters": ["context"]}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    # uvicorn's loggers keep the levels its command line gave them, and write through ours.
    "loggers": {name: {"handlers": ["console"], "propagate": False} for name in ("uvicorn", "uvicorn.error", "uvicorn.access")},
}
