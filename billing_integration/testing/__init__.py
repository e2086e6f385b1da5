"""Test helpers for projects using billing_integration.

- The pytest plugin (``billing_integration.testing.plugin``, registered as a ``pytest11`` entry
  point) starts the offline sandbox on a free port once per session and gives each test a
  fresh one through the ``billing_sandbox`` fixture, with ``settings.BILLING`` pointing at it.
- ``sign_webhook(body, secret)`` returns the Standard Webhooks headers the sandbox would send,
  to post hand-made events to your webhook view.
- ``SandboxHandle(url)`` drives a running sandbox's control endpoints from any test (its
  ``webhook_secret`` comes from ``server=`` or ``webhook_secret=``: the sandbox never answers
  it over HTTP).
"""

from __future__ import annotations

from .helpers import SandboxHandle, sign_webhook, start_sandbox

__all__ = ["SandboxHandle", "sign_webhook", "start_sandbox"]
