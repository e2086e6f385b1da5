"""Sphinx configuration of the documentation site (``make docs``).

The pages are the Markdown files of this folder, read by MyST; the settings reference is
generated from ``billing_integration/conf.py`` by ``_ext/billing_docs.py``. The build is offline
(no intersphinx, nothing fetched) and deterministic (no dates in the output).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import django

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))
sys.path.insert(0, str(HERE.parent))  # billing_integration, without an install

# The API page (api.md) is generated from billing_integration.billing, which needs Django set up.
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
django.setup()

project = "billing_integration"
author = "billing_integration contributors"
copyright = "billing_integration contributors"  # no year: the build is deterministic
release = version = "0.1.0"

extensions = ["myst_parser", "sphinx.ext.autodoc", "billing_docs"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_ext", "Thumbs.db", ".DS_Store"]

# MyST: anchors for headings down to ###, so pages can link to a section (page.md#anchor).
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

html_theme = "furo"
html_title = "billing_integration"
html_last_updated_fmt = None  # no build date in the pages
html_show_sourcelink = False
html_copy_source = False

# The API page's signatures name types of Python, Django and requests (the build is offline:
# no intersphinx) and of the package's private modules (not on the site).
nitpick_ignore_regex = [
    ("py:class", r"(uuid|datetime|decimal|collections\.abc|django|requests)\..+"),
    ("py:class", r"billing_integration\.(models|client|access\.features|sandbox)\..+"),
    ("py:class", r"SandboxServer"),  # the sandbox's private server class, named unqualified
    # Sphinx cuts HandlerResult's signature (a dataclass default "<factory>") at a comma.
    ("py:class", r"dict\[str"),
]


def _signal_doc(app: Any, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    """A signal's entry on the API page says which event sends it (not Signal's docstring)."""
    from django.dispatch import Signal

    from billing_integration.webhooks.signals import SIGNALS

    if isinstance(obj, Signal):
        types = [t for t, signal in SIGNALS.items() if signal is obj]
        sent = f"a ``{types[0]}`` event" if types else "any event"
        lines[:] = [f"Sent once {sent} is applied."]


def setup(app: Any) -> None:
    app.connect("autodoc-process-docstring", _signal_doc)
