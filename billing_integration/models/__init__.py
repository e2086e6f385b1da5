"""Models of the app, one module per concern."""

from .base import *  # noqa: F403
from .changes import *  # noqa: F403
from .customers import *  # noqa: F403
from .events import *  # noqa: F403
from .health import *  # noqa: F403
from .notices import *  # noqa: F403
from .outbox import *  # noqa: F403
from .products import *  # noqa: F403
from .records import *  # noqa: F403
from .reports import *  # noqa: F403
from .service import *  # noqa: F403
from .subscriptions import *  # noqa: F403
