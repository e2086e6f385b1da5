"""Shared fixtures. The sandbox fixtures come from the ``billing_integration.testing`` plugin."""
