"""A team (organisation) that subscribes as a whole."""

from __future__ import annotations

from django.db import models


class Team(models.Model):
    name = models.CharField(max_length=100)
    email = models.EmailField(blank=True, default="")

    def __str__(self) -> str:
        return self.name

    @property
    def first_name(self) -> str:
        """Read by the default ``BILLING['CUSTOMER_FIELDS']`` rule."""
        return self.name
