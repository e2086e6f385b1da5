"""The Django admin of the app, one module per concern.

- ``products``: plans with cycles and prices inline, publish/archive/sync actions.
- ``mirror``: customers, subscriptions, checkout sessions (remote-owned fields read-only).
- ``records``: invoices, payments, refunds (read-only).
- ``events``: the event log with replay.
- ``reports``: the reporting dashboard.
- ``notices``: the notice emails sent (read-only).
- ``health``: the Health page (what ``billing_doctor`` reports).
"""

from . import events, health, mirror, notices, products, records, reports  # noqa: F401
