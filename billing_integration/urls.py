"""URLs of the app. Include them under a prefix of your choice, e.g. ``path("billing/", ...)``."""

from django.urls import URLPattern, URLResolver, path

from .account import actions as account_actions
from .account import views as account_views
from .api import views as api_views
from .checkout import views as checkout_views
from .webhooks import views as webhook_views

app_name = "billing_integration"

urlpatterns: list[URLPattern | URLResolver] = [
    path("webhooks/", webhook_views.webhook, name="webhook"),
    path("checkout/", checkout_views.checkout, name="checkout"),
    path("trial/", checkout_views.trial, name="trial"),
    path("checkout/return/", checkout_views.checkout_return, name="checkout_return"),
    path(
        "api/checkout-sessions/",
        api_views.CheckoutSessionCreate.as_view(),
        name="api_checkout_sessions",
    ),
    path("api/subscriptions/", api_views.SubscriptionList.as_view(), name="api_subscriptions"),
    path("account/", account_views.account, name="account"),
    path("account/change-plan/", account_actions.change_plan, name="change_plan"),
    path(
        "account/subscriptions/<int:pk>/stop-renewal/",
        account_actions.stop_renewal,
        name="stop_renewal",
    ),
    path(
        "account/subscriptions/<int:pk>/resume/",
        account_actions.resume_renewal,
        name="resume_renewal",
    ),
]
