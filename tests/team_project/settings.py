"""The example project with a team as the subscriber model, on a fresh SQLite file.

``TEAM_PROJECT_DB`` names the SQLite file (required: the tests give each run its own).
"""

import os

from example_project.settings import *  # noqa: F403
from example_project.settings import BILLING, INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.team_project.teams"]
BILLING = {**BILLING, "SUBSCRIBER_MODEL": "teams.Team"}
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ["TEAM_PROJECT_DB"],
        "OPTIONS": {"timeout": 20},
    }
}
CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
