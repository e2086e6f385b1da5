"""The event callback: verification, the delivery log, one handler per event type, signals.

- ``verification``: Standard Webhooks signatures (several secrets), HTTP basic auth.
- ``views.webhook``: verify -> store (``WebhookEvent``) -> enqueue -> 2xx.
- ``types``: canonical event types and the normalisation of spellings.
- ``handlers``: the handler table; ``processing.process_event``: apply once, in order.
- ``signals``: one Django signal per canonical type and ``billing_event_received``.
"""
