"""Notices: opt-in emails to the subscriber when money moves (a payment failed, a subscription
was canceled or paused, a refund was approved).

- ``receivers``: connected to the app's own signals (``webhooks.signals``), sent after an
  event's local state is committed; they queue ``tasks.send_notice`` with the event's pk.
- ``tasks``: the Celery task; it claims the ``Notice`` row of (event, kind) before sending,
  so a replay or a redelivered task never sends twice, and retries a failed send.
- ``sending``: who receives it, the templates and their context, the message itself (Django's
  email framework: any ``EMAIL_BACKEND`` works, django-anymail included).
- ``checks``: the system checks of the ``NOTICE*`` and ``SITE_URL`` settings.

``BILLING['NOTICES']`` turns each notice on; all are off by default.
"""
