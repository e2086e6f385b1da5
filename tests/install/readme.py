"""The README's install walk-through as data: its marked code blocks and commands.

A block is marked by an HTML comment on the line before it, ``<!-- install: TARGET [MODE] -->``:
TARGET is a path relative to the folder of ``manage.py`` (MODE ``append`` or ``create``), or
``commands`` (shell lines, one command each), ``shell`` (Python for ``manage.py shell``) or
``template`` (a Django template, rendered by ``tests/test_readme_examples.py``).
The tests take the README's text as it is, so the README cannot drift from what is tested.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"

_MARKED = re.compile(
    r"<!-- install: (?P<target>\S+)(?: (?P<mode>append|create))? -->\n"
    r"```(?P<lang>\w*)\n(?P<code>.*?)^```",
    re.S | re.M,
)
_COMMENT = re.compile(r"\s+#\s.*$")


@dataclass(frozen=True)
class Block:
    target: str
    mode: str | None
    lang: str
    code: str


def blocks(text: str | None = None) -> list[Block]:
    """Every marked block of the README, in order."""
    text = README.read_text() if text is None else text
    return [Block(m["target"], m["mode"], m["lang"], m["code"]) for m in _MARKED.finditer(text)]


def files() -> list[Block]:
    """The blocks that go into a file of the new project."""
    return [b for b in blocks() if b.mode is not None]


def file_block(target: str) -> str:
    [block] = [b for b in files() if b.target == target]
    return block.code


def shell_code() -> str:
    [block] = [b for b in blocks() if b.target == "shell"]
    return block.code


def commands() -> list[str]:
    """The command lines of the ``commands`` blocks, without their trailing comments."""
    lines = []
    for block in blocks():
        if block.target == "commands":
            for line in block.code.splitlines():
                line = _COMMENT.sub("", line).strip()
                if line and not line.startswith("#"):
                    lines.append(line)
    return lines


def command(prefix: str) -> str:
    """The one README command line that starts with ``prefix``."""
    found = [line for line in commands() if line.startswith(prefix)]
    assert len(found) == 1, f"the README's install commands have {len(found)} lines {prefix!r}"
    return found[0]
