"""WSGI entry point of the webhook benchmark (``webhook_bench_site`` settings)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webhook_bench_site")
application = get_wsgi_application()
