"""billing_integration: a Django app for a subscription billing service.

Mirrored models, a transactional outbox pushed by Celery, verified event callbacks,
hosted checkout, and an offline sandbox of the service.
"""

__version__ = "0.1.0"
