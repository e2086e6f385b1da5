"""A host project as a new user first writes it: the app installed, its URLs routed, but no
``proj/celery.py``, a process-local cache, no ``rest_framework`` in ``INSTALLED_APPS`` and no
beat schedule. ``manage.py check`` must refuse it by name (``tests/test_wiring_checks.py``).
Nothing here imports ``example_project`` (whose package loads a Celery app)."""

import os

SECRET_KEY = "bare-project-test-only"
DEBUG = True
ALLOWED_HOSTS = ["testserver"]
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "billing_integration",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
ROOT_URLCONF = "tests.bare_project.urls"
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("BARE_PROJECT_DB", ":memory:"),
    }
}
CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
USE_TZ = True
BILLING = {
    "BASE_URL": "http://127.0.0.1:8100",
    "AUTH_URL": "http://127.0.0.1:8100/auth",
    "CHECKOUT_URL": "http://127.0.0.1:8100",
    "CLIENT_ID": "id",
    "CLIENT_SECRET": "secret",
    "WEBHOOK_SECRET": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
}
