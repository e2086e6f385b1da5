"""Sphinx extension of the documentation site: pages generated from the code.

``{billing-settings}`` renders every key of ``billing_integration.conf.DEFAULTS`` with its
default and its description (``conf.DOCS``), grouped by the ``# --- group ---`` comments of
``conf.py``; the keys of ``conf.REQUIRED`` are marked required with their environment
variable. So the settings reference has one source, the code, and cannot drift from it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

_GROUP = re.compile(r"^\s*# -+ (?P<name>[^-].*?)\s*-*\s*$")
_KEY = re.compile(r'^\s*"(?P<key>[A-Z][A-Z0-9_]*)"\s*:')


def setting_groups(source: str, keys: list[str]) -> list[tuple[str, list[str]]]:
    """``keys`` in the order of ``DEFAULTS`` under the ``# --- group ---`` comment above each
    in ``source`` (the text of ``conf.py``); a key found under no comment goes to "other"."""
    group_of: dict[str, str] = {}
    current = "other"
    in_defaults = False
    for line in source.splitlines():
        if line.startswith("DEFAULTS"):
            in_defaults = True
            continue
        if in_defaults and line.startswith("}"):
            break
        if not in_defaults:
            continue
        group = _GROUP.match(line)
        if group:
            current = group["name"].split(":")[0].strip()
            continue
        key = _KEY.match(line)
        if key and key["key"] not in group_of:
            group_of[key["key"]] = current
    groups: dict[str, list[str]] = {}
    for key in keys:
        groups.setdefault(group_of.get(key, "other"), []).append(key)
    return list(groups.items())


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _default(key: str, value: Any, required: dict[str, str]) -> str:
    if key in required:
        return f"**required** (`{required[key]}`)"
    return f"`{value!r}`"


def settings_markdown() -> list[str]:
    """The settings reference as Markdown lines (a rubric and a table per group)."""
    from billing_integration import conf

    source = Path(conf.__file__).read_text(encoding="utf-8")
    lines: list[str] = []
    for group, keys in setting_groups(source, list(conf.DEFAULTS)):
        lines += [f"**{_cell(group.capitalize())}**", "", "| key | default | meaning |"]
        lines.append("|---|---|---|")
        for key in keys:
            meaning = conf.DOCS.get(key, "")
            default = _default(key, conf.DEFAULTS[key], conf.REQUIRED)
            lines.append(f"| `{key}` | {_cell(default)} | {_cell(meaning)} |")
        lines.append("")
    return lines


class BillingSettingsDirective(SphinxDirective):
    """``{billing-settings}``: the generated settings reference (no arguments)."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        from billing_integration import conf

        # Rebuild the page when conf.py changes (incremental builds).
        self.env.note_dependency(str(Path(conf.__file__).resolve()))
        missing = sorted(set(conf.DEFAULTS) - set(conf.DOCS))
        if missing:
            raise self.error(
                "billing_integration.conf.DOCS has no description of " + ", ".join(missing)
            )
        container = nodes.container(classes=["billing-settings"])
        self.state.nested_parse(StringList(settings_markdown()), self.content_offset, container)
        return [container]


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("billing-settings", BillingSettingsDirective)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
