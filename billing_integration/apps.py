from django.apps import AppConfig


class BillingIntegrationConfig(AppConfig):
    name = "billing_integration"
    label = "billing_integration"
    verbose_name = "Billing"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the system checks)
        from .notices import receivers  # noqa: F401  (queues the opt-in notices)
        from .outbox import signals  # noqa: F401  (connects the receivers that write the outbox)
        from .reporting import rollups  # noqa: F401  (marks the months a change touches)
