"""The README's settings on a new project, checked as ``migrate`` checks them (with the database
checks), in seconds: the slow walk-through (``test_new_project.py``) runs the rest.

The project is made by ``django-admin startproject proj`` in a temporary folder and gets the
README's blocks as written; it runs with the README's defaults (SQLite, the filesystem broker,
the database cache) whatever the outer environment says.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from .readme import file_block, files

OUTER = ("DATABASE_URL", "CELERY_BROKER_URL", "CACHE_URL", "DJANGO_SETTINGS_MODULE")


def test_the_readme_settings_pass_the_database_checks_on_sqlite(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in OUTER and not k.startswith("BILLING")}
    bin_dir = Path(sys.executable).parent
    subprocess.run(
        [str(bin_dir / "django-admin"), "startproject", "proj"], cwd=tmp_path, env=env, check=True
    )
    project = tmp_path / "proj"
    for block in files():
        if block.target.startswith("proj/"):
            path = project / block.target
            before = path.read_text() + "\n" if block.mode == "append" else ""
            path.write_text(before + block.code)
    done = subprocess.run(
        [sys.executable, "manage.py", "check", "--database", "default"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues" in done.stdout + done.stderr, done.stderr

    # The settings' comment names the folders the filesystem broker uses: they are there.
    named = re.search(
        r"^# Default broker: folders under (\S+) ", file_block("proj/settings.py"), re.M
    )
    assert named, "the README's settings no longer say where the default broker's folders are"
    folder = project / named[1]
    assert sorted(p.name for p in folder.iterdir()) == ["control", "queue"], named[1]
