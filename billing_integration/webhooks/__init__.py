"""The event callback: verification, the delivery log, handlers, processing, signals."""
