"""README.md is a newcomer's overview: the two commands, the install walk-through (the same
text as docs/install.md), the host test example, and links to the documentation site that
all resolve. Every setting is documented on docs/settings.md (``tests/test_docs.py``)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()

# [text](target): Markdown links; code spans hold no links.
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _relative_links(text: str) -> list[str]:
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", "``", text)
    return [t for t in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def test_readme_names_the_two_commands():
    assert "make demo" in README and "make test" in README


def test_readme_keeps_the_install_section_that_the_docs_include():
    assert README.count("<!-- install:start -->") == 1
    assert README.count("<!-- install:end -->") == 1
    assert "## Installing into your project\n<!-- install:start -->" in README
    install_page = (ROOT / "docs" / "install.md").read_text()
    assert "<!-- install:start -->" in install_page and "<!-- install:end -->" in install_page


def test_every_relative_link_of_the_readme_points_to_an_existing_file():
    links = _relative_links(README)
    assert len(links) > 10
    missing = [t for t in links if not (ROOT / t.split("#", 1)[0]).is_file()]
    assert missing == []


def test_the_readme_links_every_docs_page():
    linked = {t.split("#", 1)[0] for t in _relative_links(README)}
    pages = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md") if p.name != "index.md"}
    assert sorted(pages - linked) == []


def test_every_markdown_file_named_in_the_readme_and_the_docs_is_in_the_repository():
    """A `name.md` in code style is a path from the repository's root that exists: the pages
    never send a reader to a file outside the repository."""
    named = {}
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for name in re.findall(r"`([^`\s]+\.md)`", path.read_text()):
            named.setdefault(name, path.name)
    assert len(named) > 5
    missing = {name: page for name, page in named.items() if not (ROOT / name).is_file()}
    assert missing == {}


def test_the_link_check_sees_a_broken_link():
    assert _relative_links("[a](docs/nope.md) `[b](x.md)` [c](https://e.org)") == ["docs/nope.md"]


def test_the_demo_banner_lists_every_page_the_readme_says_it_prints():
    """The README's "`make demo` ... prints:" table against the Makefile's banner."""
    table = README.split("and prints:", 1)[1].split("\n\n", 2)[1]
    banner = (ROOT / "Makefile").read_text().split("\ndemo: ", 1)[1].split("honcho", 1)[0]
    echoed = "\n".join(line for line in banner.splitlines() if "@echo" in line)
    paths = re.findall(r"`(/[a-z_/]*)`", table)
    assert {"/pricing/", "/members/", "/account/", "/reports/"} <= set(paths), paths
    for page in paths:
        assert f'$(DEMO_WEB_PORT){page}"' in echoed, page
    assert "/admin/" in echoed and "/_sandbox/" in echoed


def test_upgrading_lists_every_removed_setting_with_what_replaced_it():
    from billing_integration.conf import REMOVED

    upgrading = README.split("\n## Upgrading\n", 1)[1].split("\n## ", 1)[0]
    missing = [k for k, v in REMOVED.items() if f"| `{k}` | {v} |" not in upgrading]
    assert missing == []


def test_the_line_count_of_the_package_is_the_one_the_readme_gives():
    """The figure of "What is not done yet": the package's lines of Python outside the sandbox
    and the migrations (``wc -l``), so a change of the code changes it."""
    package = ROOT / "billing_integration"
    files = [
        path
        for path in package.rglob("*.py")
        if not {"sandbox", "migrations"} & set(path.relative_to(package).parts)
    ]
    lines = sum(path.read_bytes().count(b"\n") for path in files)
    assert f"**The package is {lines:,} lines of Python** outside the sandbox and migrations" in (
        README
    )


def test_where_things_live_names_every_package_of_the_app():
    """ "Where things live" names each subpackage of ``billing_integration`` but Django's own
    kinds of folder (migrations, management commands, template tags)."""
    section = README.partition("\n## Where things live\n")[2].partition("\n## ")[0]
    listed = set(re.findall(r"^  (\w+)/", section, re.M))
    package = ROOT / "billing_integration"
    packages = {p.parent.name for p in package.glob("*/__init__.py")}
    assert sorted(packages - {"migrations", "management", "templatetags"} - listed) == []
