from django.contrib import admin
from django.urls import include, path

from billing_integration.account import views as billing_account

from . import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("i18n/", include("django.conf.urls.i18n")),  # set_language: the language switch
    path("billing/", include("billing_integration.urls")),
    # (demo) the example SaaS
    path("", views.home, name="home"),
    path("pricing/", views.pricing, name="pricing"),
    path("members/", views.members, name="members"),
    path("reports/", views.reports, name="reports"),
    # the app's billing page, also at the site's own /account/ address
    path("account/", billing_account.account, name="account"),
    path("accounts/signup/", views.signup, name="signup"),
    path("accounts/", include("django.contrib.auth.urls")),
]
