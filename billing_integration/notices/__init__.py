"""Notices: opt-in emails to the subscriber when money moves (``BILLING['NOTICES']``)."""
