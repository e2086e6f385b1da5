"""``python -m billing_integration.sandbox``."""

import sys

from .server import main

if __name__ == "__main__":
    sys.exit(main())
