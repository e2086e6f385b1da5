"""URLs of the app. Include them under a prefix of your choice, e.g. ``path("billing/", ...)``."""

from django.urls import path

from .webhooks import views as webhook_views

app_name = "billing_integration"

urlpatterns: list = [
    path("webhooks/", webhook_views.webhook, name="webhook"),
]
