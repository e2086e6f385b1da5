"""The Django admin of the app, one module per concern."""

from . import changes, events, health, mirror, notices, products, records, reports  # noqa: F401
