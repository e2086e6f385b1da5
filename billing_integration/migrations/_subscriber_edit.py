"""Re-apply the hand edit of 0001_initial after regenerating it (run from the repo root):

    rm billing_integration/migrations/0001_initial.py
    .venv/bin/python manage.py makemigrations billing_integration
    .venv/bin/python billing_integration/migrations/_subscriber_edit.py

The edit makes ``Customer.subscriber`` point at ``BILLING['SUBSCRIBER_MODEL']`` (default
``AUTH_USER_MODEL``) with a swappable-style dependency, so a team/organisation model works.
This file is not a migration (its name starts with an underscore, Django ignores it).
"""

import pathlib
import re
import sys

PATH = pathlib.Path(__file__).with_name("0001_initial.py")
HEADER = (
    "\n\n# Hand edit (billing_integration): the subscriber model is BILLING['SUBSCRIBER_MODEL'],\n"
    "# default AUTH_USER_MODEL. Re-apply with billing_integration/migrations/_subscriber_edit.py.\n"
    "SUBSCRIBER_MODEL = (getattr(settings, 'BILLING', None) or {}).get('SUBSCRIBER_MODEL') "
    "or settings.AUTH_USER_MODEL\n"
)


def main() -> int:
    text = PATH.read_text()
    if "SUBSCRIBER_MODEL = " in text:
        print("already edited")
        return 0
    text = text.replace(
        "from django.db import migrations, models\n",
        "from django.db import migrations, models\n" + HEADER,
        1,
    )
    text = text.replace(
        "migrations.swappable_dependency(settings.AUTH_USER_MODEL)",
        "migrations.swappable_dependency(SUBSCRIBER_MODEL)",
    )
    text, n = re.subn(
        r"(\('subscriber', models\.OneToOneField\([^\n]*?)to=settings\.AUTH_USER_MODEL",
        r"\1to=SUBSCRIBER_MODEL",
        text,
    )
    if n != 1:
        print("subscriber field not found", file=sys.stderr)
        return 1
    PATH.write_text(text)
    print("edited", PATH)
    return 0


if __name__ == "__main__":
    sys.exit(main())
