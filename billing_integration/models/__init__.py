"""Models of the app, one module per concern.

- ``base``: ``RemoteObject``, the abstract base of every mirrored object.
- ``products``, ``customers``, ``subscriptions``, ``checkout``: the mirrored resources.
- ``outbox``: the transactional outbox of local changes to push.
- ``events``: the log of received event deliveries.
- ``records``: invoices, payments and refunds, known only from events.
- ``reporting``: ``Report``, the proxy behind the admin reporting dashboard.
- ``service``: ``ServiceBinding``, which billing service the mirror belongs to.
- ``notices``: ``Notice``, the record of the notice emails sent about events.
- ``health``: ``Heartbeat`` (last runs of the periodic jobs) and ``Health``, the proxy behind
  the admin Health page.
"""

from .base import *  # noqa: F403
from .checkout import *  # noqa: F403
from .customers import *  # noqa: F403
from .events import *  # noqa: F403
from .health import *  # noqa: F403
from .notices import *  # noqa: F403
from .outbox import *  # noqa: F403
from .products import *  # noqa: F403
from .records import *  # noqa: F403
from .reporting import *  # noqa: F403
from .service import *  # noqa: F403
from .subscriptions import *  # noqa: F403
