"""The customer's billing page: ``billing_integration:account`` (``account/`` under the
app's URLs). See ``views``."""
