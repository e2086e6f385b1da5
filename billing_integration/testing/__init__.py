"""Test helpers: the pytest plugin (``billing_integration.testing.plugin``, a ``pytest11`` entry
point) with the ``billing_sandbox`` fixture, ``sign_webhook(body, secret)`` and
``SandboxHandle(url)`` for a running sandbox's control endpoints."""

from .helpers import SandboxHandle, sign_webhook, start_sandbox

__all__ = ["SandboxHandle", "sign_webhook", "start_sandbox"]
