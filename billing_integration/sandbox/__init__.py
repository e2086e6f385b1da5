"""An offline emulator of the billing service.

An independent WSGI service (Werkzeug) that shares only the wire format with the app: the
token endpoint, the billing API, the hosted checkout page, signed event delivery, a test
clock and fault injection. It never imports Django or the rest of ``billing_integration``.

    python -m billing_integration.sandbox --port 8100

See ``docs/sandbox.md``.
"""

from .server import SandboxServer, main

__all__ = ["SandboxServer", "main"]
