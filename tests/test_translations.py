"""The app's French catalogue (issue 16): every string marked for translation in
``billing_integration`` is translated in ``locale/fr/LC_MESSAGES/django.po``, and the committed
``django.mo`` is that ``.po`` compiled.

The strings are extracted the way a maintainer does (``makemessages -l fr`` inside the package,
sandbox and migrations ignored), into a temporary copy of the package so the working tree is
left alone. Catalogues are read with GNU gettext's own tools and ``gettext.GNUTranslations``:
``msgfmt`` leaves out untranslated and fuzzy entries, ``msgen`` fills a template with its
msgids. Needs ``xgettext`` and ``msgfmt`` (marker ``gettext``: skipped without them, a failure
under CI).
"""

from __future__ import annotations

import gettext
import shutil
import subprocess
from pathlib import Path

import pytest
from django.core.management import call_command

import billing_integration

pytestmark = pytest.mark.gettext

PACKAGE = Path(billing_integration.__file__).parent
PO = PACKAGE / "locale" / "fr" / "LC_MESSAGES" / "django.po"
MO = PO.with_suffix(".mo")
IGNORED = ("sandbox", "migrations", "testing", "__pycache__")


def catalogue(mo: Path) -> dict:
    """The entries of a compiled catalogue: msgid (``ctx\\x04msgid`` with a context, or
    ``(msgid, n)`` for plural forms) -> msgstr; the header (msgid ``""``) left out."""
    with mo.open("rb") as fp:
        entries = dict(gettext.GNUTranslations(fp)._catalog)  # type: ignore[attr-defined]
    entries.pop("", None)
    return entries


def compile_po(po: Path, mo: Path) -> dict:
    subprocess.run(["msgfmt", "--check-format", "-o", str(mo), str(po)], check=True)
    return catalogue(mo)


def extracted_msgids(package: Path, tmp: Path) -> set:
    """The keys (as in ``catalogue``) of every string ``makemessages -l fr`` extracts from a
    copy of ``package``."""
    copy = tmp / package.name
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns(*IGNORED))
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(copy)
        call_command(
            "makemessages",
            locale=["fr"],
            ignore_patterns=list(IGNORED),
            keep_pot=True,
            verbosity=0,
        )
    pot = copy / "locale" / "django.pot"
    # The template's header has placeholders GNUTranslations cannot read: English plurals.
    pot.write_text(
        pot.read_text().replace(
            "nplurals=INTEGER; plural=EXPRESSION;", "nplurals=2; plural=(n != 1);"
        )
    )
    english = tmp / "english.po"
    # msgen: every msgstr set to its msgid, so msgfmt keeps every entry of the template.
    subprocess.run(["msgen", "-o", str(english), str(pot)], check=True)
    return set(compile_po(english, tmp / "english.mo"))


def untranslated(package: Path, tmp: Path, po: Path = PO) -> list:
    translated = {key: value for key, value in catalogue_of_committed_po(tmp, po).items() if value}
    return sorted(map(str, extracted_msgids(package, tmp) - set(translated)))


def catalogue_of_committed_po(tmp: Path, po: Path = PO) -> dict:
    return compile_po(po, tmp / "committed.mo")


def test_every_extracted_string_is_translated_into_french(tmp_path: Path) -> None:
    assert PO.exists(), "no French catalogue: run makemessages -l fr in billing_integration/"
    missing = untranslated(PACKAGE, tmp_path)
    assert missing == [], (
        f"{len(missing)} string(s) not translated (or fuzzy) in {PO.relative_to(PACKAGE)}: run "
        "`django-admin makemessages -l fr -i sandbox -i migrations -i testing` in "
        f"billing_integration/, translate, compile: {missing[:20]}"
    )


def test_a_new_untranslated_string_is_caught(tmp_path: Path) -> None:
    """The check above can fail: a string added to a copy of the package is reported."""
    package = tmp_path / "source"
    shutil.copytree(PACKAGE, package, ignore=shutil.ignore_patterns(*IGNORED))
    (package / "new_module.py").write_text(
        "from django.utils.translation import gettext\n\n"
        "TEXT = gettext('A sentence nobody translated yet.')\n"
    )
    work = tmp_path / "work"
    work.mkdir()
    assert untranslated(package, work) == ["A sentence nobody translated yet."]


def test_the_committed_mo_is_the_po_compiled(tmp_path: Path) -> None:
    assert MO.exists(), "no compiled catalogue: run compilemessages in billing_integration/"
    assert catalogue(MO) == catalogue_of_committed_po(tmp_path), (
        "django.mo is out of date with django.po: run `django-admin compilemessages` in "
        "billing_integration/"
    )


def test_plural_and_context_entries_are_translated(tmp_path: Path) -> None:
    """Every plural form and the status labels (with a context) have a French text."""
    entries = catalogue_of_committed_po(tmp_path)
    assert entries[("Every %(n)d month", 1)] == "Tous les %(n)d mois"
    assert entries["subscription status\x04Active"] == "Actif"
    assert all(value for value in entries.values())


def test_the_example_projects_catalogue(tmp_path: Path) -> None:
    """The example project's own pages (base.html's navigation, pricing, login...) in French."""
    example = PACKAGE.parent / "example_project"
    po = example / "locale" / "fr" / "LC_MESSAGES" / "django.po"
    assert untranslated(example, tmp_path, po) == []
    assert catalogue(po.with_suffix(".mo")) == catalogue_of_committed_po(tmp_path, po)
