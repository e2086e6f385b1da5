from django.contrib import admin
from django.urls import include, path

from . import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("billing/", include("billing_integration.urls")),
    # (demo) the example SaaS
    path("", views.home, name="home"),
    path("pricing/", views.pricing, name="pricing"),
    path("members/", views.members, name="members"),
    path("reports/", views.reports, name="reports"),
    path("account/", views.account, name="account"),
    path("accounts/signup/", views.signup, name="signup"),
    path("accounts/", include("django.contrib.auth.urls")),
]
