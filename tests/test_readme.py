"""README.md tells the truth about settings: every BILLING key is documented there."""

from pathlib import Path

from billing_integration.conf import DEFAULTS

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def test_every_setting_is_documented():
    missing = [key for key in DEFAULTS if f"`{key}`" not in README]
    assert missing == []


def test_readme_names_the_two_commands():
    assert "make demo" in README and "make test" in README
