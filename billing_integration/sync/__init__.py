"""Pull (remote -> local): ``billing_integration.sync.pull``. See ``docs/mirror.md``."""
