"""A tiny project whose subscriber model is a team (``BILLING['SUBSCRIBER_MODEL'] = "teams.Team"``).

Used by ``tests/mirror/test_team_subscriber.py`` in a subprocess: the app's migration reads
the setting at migration time, so it needs its own settings module and a fresh database.
"""
