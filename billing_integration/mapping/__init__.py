"""The mapping between the service's JSON and the models, one module per resource:
``to_remote(obj)`` and ``from_remote(data)``."""

from . import checkout, customers, products, subscriptions
from .common import remote_meta

__all__ = ["checkout", "customers", "products", "remote_meta", "subscriptions"]
