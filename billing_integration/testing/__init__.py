"""Test helpers: the pytest plugin (``testing.plugin``), ``sign_webhook``, ``deliver_event``
and ``SandboxHandle``."""

from .helpers import SandboxHandle, deliver_event, sign_webhook, start_sandbox

__all__ = ["SandboxHandle", "deliver_event", "sign_webhook", "start_sandbox"]
