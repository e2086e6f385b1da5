"""Test helpers: the pytest plugin (``testing.plugin``), ``sign_webhook`` and ``SandboxHandle``."""

from .helpers import SandboxHandle, sign_webhook, start_sandbox

__all__ = ["SandboxHandle", "sign_webhook", "start_sandbox"]
