"""The mapping between the service's JSON and the models, one module per resource:
``to_remote(obj)`` and ``from_remote(data)``."""
