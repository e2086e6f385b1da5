"""Admin: see the package docstring."""
