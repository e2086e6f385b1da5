"""The mapping between the service's JSON and the models: one module per resource.

Each module offers, both directions:

- ``to_remote(obj) -> dict``: the request body in wire shape;
- ``from_remote(data) -> dict``: model field values from a response/list/event resource;
- (products) ``diff_for_patch(obj, changed=()) -> dict``: only the fields that changed.

Currency ids <-> codes go through ``billing_integration.currencies``.
Timestamps: ``billing_integration.timestamps``.
"""

from . import checkout, customers, products, subscriptions
from .common import remote_meta

__all__ = ["checkout", "customers", "products", "remote_meta", "subscriptions"]
