"""Serving the sandbox: a threaded Werkzeug server speaking HTTP/1.1, and the CLI.

Werkzeug's server answers every request with ``Connection: close`` (its request handler
cannot drain a body before the next request line), so clients reconnect per request; the
benchmarks' floors pay the same.

    [BILLING_SANDBOX_WEBHOOK_SECRET=whsec_...] python -m billing_integration.sandbox
        --port 8100 [--host H] [--data FILE] [--reset]
        [--client-id ID] [--client-secret S] [--token-lifetime SECONDS]
        [--callback-url URL] [--retry-schedule 1,5,30]
        [--max-attempts N] [--return-url URL] [--allowed-host NAME ...] [--memory] [--quiet]

The webhook secret comes from the environment (``BILLING_SANDBOX_WEBHOOK_SECRET``), never from
the command line, which every user of the machine can read (``ps``); without it the secret
kept in the data file is used, or one is generated.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import struct
import sys
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from werkzeug.serving import WSGIRequestHandler, make_server

from .app import SandboxApp
from .config import SandboxConfig, valid_webhook_secret
from .store import Store
from .web import DropConnection

DEFAULT_DATA = "var/sandbox.sqlite3"
#: The environment variable the CLI reads the webhook secret from.
WEBHOOK_SECRET_ENV = "BILLING_SANDBOX_WEBHOOK_SECRET"


class SandboxStartError(Exception):
    """The sandbox cannot start as configured (the message names what to fix)."""


class _RefusedOnCommandLine(argparse.Action):
    """An option that used to carry a secret: refused, with where to put it instead."""

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        parser.error(
            f"{self.option_strings[0]} is not accepted: a command line is readable by every "
            f"user of the machine (ps). Set the environment variable {WEBHOOK_SECRET_ENV}."
        )


class SandboxRequestHandler(WSGIRequestHandler):
    """HTTP/1.1 (the connection still closes after each answer); ``DropConnection`` closes
    the socket with a TCP RST."""

    protocol_version = "HTTP/1.1"
    _rst = False

    def connection_dropped(self, error: BaseException, environ: Any = None) -> None:
        self.close_connection = True
        if isinstance(error, DropConnection):
            self._rst = True
            with contextlib.suppress(OSError):
                self.connection.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                )

    def finish(self) -> None:
        super().finish()
        if self._rst:
            with contextlib.suppress(OSError):
                self.connection.close()  # linger 0: the peer sees a reset, not a clean close

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        if not getattr(self.server.app, "quiet", False):
            super().log_request(code, size)


class SandboxServer:
    """A sandbox bound to a port; ``start()`` serves from a background thread."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 8100,
        data: str | Path | None = DEFAULT_DATA,
        *,
        reset: bool = False,
        quiet: bool = False,
        allowed_hosts: Iterable[str] = (),
        **settings: Any,
    ) -> None:
        try:
            self.store = Store(data, reset=reset)
        except ValueError as exc:  # --data names a file that is not the sandbox's
            raise SandboxStartError(str(exc)) from None
        self.config = SandboxConfig.load(self.store, settings)
        self.app = SandboxApp(self.store, self.config)
        self.app.quiet = quiet
        self.httpd = make_server(
            host, port, self.app, threaded=True, request_handler=SandboxRequestHandler
        )
        self.httpd.daemon_threads = True  # type: ignore[attr-defined]  # threaded=True makes a ThreadedWSGIServer; the stub types it as its base
        self.host = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host  # noqa: S104
        # the names it answers as, beside loopback ones (a request naming another is refused)
        self.app.hosts = {n.strip("[]").lower() for n in (self.host, *allowed_hosts)}
        self.port = self.httpd.server_port
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def env(self) -> dict[str, str]:
        """The settings the app needs, as the environment variables of the example project."""
        return {
            "BILLING_BASE_URL": self.url,
            "BILLING_AUTH_URL": f"{self.url}/auth",
            "BILLING_CHECKOUT_URL": self.url,
            "BILLING_CLIENT_ID": self.config.client_id,
            "BILLING_CLIENT_SECRET": self.config.client_secret,
            "BILLING_WEBHOOK_SECRET": self.config.webhook_secret,
        }

    def start(self) -> SandboxServer:
        self.app.delivery.start()
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, name="billing-sandbox", daemon=True
        )
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self.app.delivery.start()
        try:
            self.httpd.serve_forever()
        finally:
            self.app.delivery.stop()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.app.delivery.stop()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.store.close()

    def __enter__(self) -> SandboxServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The sandbox's options (shared by the CLI and the ``billing_sandbox`` command)."""
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument(
        "--data",
        default=DEFAULT_DATA,
        help=f"SQLite file keeping the state (default {DEFAULT_DATA})",
    )
    parser.add_argument("--memory", action="store_true", help="keep the state in memory only")
    parser.add_argument("--reset", action="store_true", help="wipe the data file first")
    parser.add_argument("--client-id", help="default sandbox-client")
    parser.add_argument("--client-secret", help="default sandbox-secret")
    parser.add_argument("--token-lifetime", type=int, help="expires_in in seconds (default 300)")
    parser.add_argument("--callback-url", help="where events are delivered")
    parser.add_argument(
        "--webhook-secret",
        action=_RefusedOnCommandLine,
        nargs="?",
        help=f"refused: set {WEBHOOK_SECRET_ENV}=whsec_... in the environment "
        "(default: generated once and kept)",
    )
    parser.add_argument("--retry-schedule", help="delivery retry delays in seconds, e.g. 1,5,30")
    parser.add_argument("--max-attempts", type=int, help="delivery attempts before giving up")
    parser.add_argument(
        "--return-url", help="where checkout sends the customer back ({session_id} replaced)"
    )
    parser.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a host name requests may name beside loopback ones and --host (repeatable); "
        "others are refused 400",
    )
    parser.add_argument("--quiet", action="store_true", help="do not log each request")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="billing_sandbox",
        description="Offline sandbox of the billing service. The webhook secret is read from "
        f"the environment variable {WEBHOOK_SECRET_ENV} (default: generated once and kept).",
    )
    add_arguments(parser)
    return parser


def webhook_secret_from_env(environ: Any = None) -> str | None:
    """``BILLING_SANDBOX_WEBHOOK_SECRET`` (None when unset or empty); raises
    ``SandboxStartError`` (without the value) when it is not a ``whsec_`` secret."""
    value = (os.environ if environ is None else environ).get(WEBHOOK_SECRET_ENV) or None
    if value is not None and not valid_webhook_secret(value):
        raise SandboxStartError(
            f"{WEBHOOK_SECRET_ENV} is not a webhook secret: 'whsec_' followed by the base64 of "
            "at least 16 bytes."
        )
    return value


def run(options: dict[str, Any]) -> int:
    """Start the sandbox from parsed options (the webhook secret from the environment), print
    the settings to paste, serve until ^C. Raises ``SandboxStartError``."""
    webhook_secret = webhook_secret_from_env()
    server = SandboxServer(
        options["host"],
        options["port"],
        None if options.get("memory") else options["data"],
        reset=options.get("reset", False),
        quiet=options.get("quiet", False),
        client_id=options.get("client_id"),
        client_secret=options.get("client_secret"),
        token_lifetime=options.get("token_lifetime"),
        callback_url=options.get("callback_url"),
        webhook_secret=webhook_secret,
        retry_schedule=options.get("retry_schedule"),
        max_attempts=options.get("max_attempts"),
        return_url=options.get("return_url"),
        allowed_hosts=options.get("allowed_host") or (),
    )
    for key, value in server.env().items():
        print(f"{key}={value}")
    sys.stdout.flush()
    where = "memory" if options.get("memory") else options["data"]
    print(
        f"# Billing sandbox on {server.url} (state: {where}); "
        f"dashboard {server.url}/_sandbox/ - Ctrl+C to stop",
        file=sys.stderr,
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.httpd.server_close()
        server.store.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        return run(vars(build_parser().parse_args(argv)))
    except SandboxStartError as exc:
        print(f"billing_sandbox: {exc}", file=sys.stderr)
        return 2
