"""Settings of the example project.

Everything that differs between machines comes from the environment (django-environ), with
embedded defaults that need no server: SQLite, and a Celery broker on the local filesystem.
The sandbox (``python manage.py billing_sandbox``) prints the BILLING_* lines to paste.
"""

import os
from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = BASE_DIR / "var"

env = environ.Env()
environ.Env.read_env(BASE_DIR / ".env", overwrite=False)

DEBUG = env.bool("DEBUG", default=True)
SECRET_KEY = env("SECRET_KEY", default="example-project-not-for-production")
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "testserver"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "billing_integration",
    "example_project",  # (demo) the billing_demo_seed command
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    # The language of each request: the set_language cookie, else Accept-Language (LANGUAGES).
    "django.middleware.locale.LocaleMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "example_project.urls"
WSGI_APPLICATION = "example_project.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "example_project" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{VAR_DIR / 'db.sqlite3'}")}
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # Several processes (web, worker, beat) share the file: wait for locks, don't fail.
    DATABASES["default"].setdefault("OPTIONS", {})["timeout"] = 20
    # (mirror) Take the write lock when a transaction starts: concurrent writers then wait
    # (timeout above) instead of failing with "database is locked" on a lock upgrade.
    DATABASES["default"]["OPTIONS"]["transaction_mode"] = "IMMEDIATE"
    # (mirror) Tests: a file DB, so a real Celery worker process can open the test database.
    # One file per test process (concurrent runs must not share it).
    DATABASES["default"]["TEST"] = {
        "NAME": env("TEST_SQLITE_NAME", default=str(VAR_DIR / f"test-db-{os.getpid()}.sqlite3"))
    }
    # The reporting indexes INCLUDE extra columns for index-only scans on PostgreSQL; SQLite
    # has no covering indexes and builds them without those columns (a backend limitation,
    # nothing to fix): its warning models.W040 is silenced on SQLite only.
    SILENCED_SYSTEM_CHECKS = ["models.W040"]
else:
    # Persistent connections (Django's own): a web or worker process keeps its connection for
    # up to this many seconds instead of opening one per request or task, and checks it
    # before reusing it. Celery closes the connections after every task unless
    # CELERY_DB_REUSE_MAX is set; example_project/celery.py then applies this age between
    # tasks as Django does between requests (docs/production.md, "Database connections").
    DATABASES["default"]["CONN_MAX_AGE"] = env.int("DATABASE_CONN_MAX_AGE", default=60)
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
    CELERY_DB_REUSE_MAX = 1000

CACHES = {
    "default": env.cache_url("CACHE_URL", default="dbcache://billing_cache"),
}

AUTH_PASSWORD_VALIDATORS = []
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
# The languages the site offers (the switch in base.html); billing_integration ships French.
LANGUAGES = [("en", "English"), ("fr", "Français")]
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/"

# --- billing_integration --------------------------------------------------------------------
BILLING = {
    "BASE_URL": env("BILLING_BASE_URL", default="http://127.0.0.1:8100"),
    "AUTH_URL": env("BILLING_AUTH_URL", default="http://127.0.0.1:8100/auth"),
    "CHECKOUT_URL": env("BILLING_CHECKOUT_URL", default="http://127.0.0.1:8100"),
    "CLIENT_ID": env("BILLING_CLIENT_ID", default="sandbox-client"),
    "CLIENT_SECRET": env("BILLING_CLIENT_SECRET", default="sandbox-secret"),
    "WEBHOOK_SECRET": env("BILLING_WEBHOOK_SECRET", default=None),
    "BASE_TEMPLATE": "base.html",  # the billing pages look like the rest of the site
    "PRICING_URL": "pricing",  # where a lapsed subscriber chooses a plan again
}
# (mirror) Any other BILLING key as JSON, e.g. BILLING_EXTRA='{"NOTICES": {"payment_failed": true}}'
# (used by the worker processes the tests and benchmarks start).
BILLING.update(env.json("BILLING_EXTRA", default={}))

# Requests to change plan or stop renewal are emailed to MANAGERS (docs/changes.md); in the
# demo they are printed by the web process.
MANAGERS = [("Billing staff", env("BILLING_STAFF_EMAIL", default="staff@example.com"))]
EMAIL_BACKEND = env("EMAIL_BACKEND", default="django.core.mail.backends.console.EmailBackend")

# --- Celery ---------------------------------------------------------------------------------
# Default: a broker on the local filesystem, so the demo needs no server. Production: set
# CELERY_BROKER_URL to redis://... or amqp://... (see docs/production.md).
CELERY_BROKER_URL = env("CELERY_BROKER_URL", default="filesystem://")
if CELERY_BROKER_URL.startswith("filesystem://"):
    # (demo) CELERY_BROKER_FOLDER gives a stack its own queue folder (`make demo-check` runs
    # beside a running `make demo` without the two workers taking each other's messages).
    _broker_dir = Path(env("CELERY_BROKER_FOLDER", default=str(VAR_DIR)))
    _queue = _broker_dir / "celery-broker"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_queue),
        "data_folder_out": str(_queue),
        "processed_folder": str(_broker_dir / "celery-processed"),
        "store_processed": False,
        "control_folder": str(_broker_dir / "celery-control"),  # else ./control in the cwd
        "polling_interval": 0.1,  # (mirror) seconds between looks at the folder (default 1)
    }
    for _d in (_queue, _broker_dir / "celery-processed", _broker_dir / "celery-control"):
        _d.mkdir(parents=True, exist_ok=True)
elif CELERY_BROKER_URL.split("://", 1)[0] in ("amqp", "amqps", "pyamqp"):
    # RabbitMQ needs no option: an unacknowledged message returns to its queue when its
    # connection closes (no visibility timeout). Publisher confirms ("confirm_publish") stay
    # off: with them a publish to a broker that blocks its publishers (a memory or disk
    # alarm) waits until the alarm ends, web requests included (docs/production.md).
    CELERY_BROKER_TRANSPORT_OPTIONS = {}
else:
    # Redis and SQS redeliver an unacknowledged message after the visibility timeout:
    # keep it above the longest task retry wait (300 s: a push retry's longest wait).
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600}
# A worker started while the broker is down retries until it answers, as it does when the
# broker goes away later (Celery 5 also does so when this is unset; set, it says so).
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_ALWAYS_EAGER = env.bool("CELERY_TASK_ALWAYS_EAGER", default=False)
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_RESULT_BACKEND = None
# The queue of every task without a route (Celery's default, "celery"); the tests and benchmarks
# give each worker a queue of its own with CELERY_TASK_DEFAULT_QUEUE. A host sends only the app's
# tasks to a queue of their own with CELERY_TASK_ROUTES = {"billing_integration.*": {"queue":
# "billing"}} and a worker started with -Q billing (docs/production.md).
CELERY_TASK_DEFAULT_QUEUE = env("CELERY_TASK_DEFAULT_QUEUE", default="celery")
# (mirror) Periodic tasks: drain outbox entries whose message was lost, and reconcile.
from billing_integration.schedule import BEAT_SCHEDULE as _BILLING_BEAT  # noqa: E402

CELERY_BEAT_SCHEDULE = {**_BILLING_BEAT}

VAR_DIR.mkdir(exist_ok=True)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "[%(asctime)s: %(levelname)s/%(name)s] %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "billing_integration": {
            "handlers": ["console"],
            "level": env("BILLING_LOG_LEVEL", default="INFO"),
        },
        # the worker's own lines (tasks received, succeeded): example_project/celery.py has the
        # worker use this configuration instead of Celery's
        "celery": {"handlers": ["console"], "level": "INFO"},
    },
}
