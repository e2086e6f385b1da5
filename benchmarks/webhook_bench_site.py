"""Settings and URLs for ``bench_webhooks.py`` (benchmark only; not part of the app).

Extends the example project's settings: PostgreSQL from ``DATABASE_URL``, DEBUG off, a fixed
webhook secret, and ``webhook_bench_urls`` as the URLconf with two targets:

- ``/billing/webhooks/``: the app's callback (verify, store, enqueue on Celery);
- ``/bare/``: the baseline, a plain Django view doing one INSERT of the body.
"""

from __future__ import annotations

import os

from example_project.settings import *  # noqa: F403

BENCH_SECRET = "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="

DEBUG = False
ROOT_URLCONF = "webhook_bench_urls"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]
BILLING = {**BILLING, "WEBHOOK_SECRET": BENCH_SECRET}  # noqa: F405
LOGGING = {"version": 1, "disable_existing_loggers": False}
CONN_MAX_AGE = 60
DATABASES["default"]["CONN_MAX_AGE"] = 60  # noqa: F405
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/7")

BARE_TABLE = "bench_bare_delivery"
