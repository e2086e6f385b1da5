"""URLs of the app. Include them under a prefix of your choice, e.g. ``path("billing/", ...)``."""

from django.urls import path  # noqa: F401

app_name = "billing_integration"

urlpatterns: list = []
