"""The example tests of docs/testing.md and docs/events.md, run as they are written.

Every Python block of those pages that defines a ``test_`` function or method is executed into
this module, so pytest collects and runs it here (a Django ``TestCase`` too) with the real
fixtures (``billing_sandbox``, ``live_server``, ...). What the page leaves to the reader is
provided below: Celery running eagerly (the page's stated test setting), a ``product``
fixture, and an ``envelope`` from docs/events.md.
"""

from __future__ import annotations

import json
import re
from decimal import Decimal
from pathlib import Path

import pytest
from celery import current_app
from django.db import transaction

from billing_integration.models import BillingCycle, Price, Product

PAGE = Path(__file__).resolve().parent.parent / "docs" / "testing.md"
EVENTS = Path(__file__).resolve().parent.parent / "docs" / "events.md"


def example_blocks(page: Path = PAGE) -> list[str]:
    """The page's Python blocks that define a test."""
    text = page.read_text(encoding="utf-8")
    blocks = re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)
    return [block for block in blocks if re.search(r"^\s*def test_", block, re.M)]


#: What docs/testing.md's hand-made event example posts: the events page's invoice.paid.
envelope = json.loads(
    re.search(
        r"^### `invoice\.paid`\n\n```json\n(.*?)^```",
        EVENTS.read_text(encoding="utf-8"),
        re.S | re.M,
    ).group(1)
)


@pytest.fixture(autouse=True)
def eager_celery():
    """The page's test settings: ``CELERY_TASK_ALWAYS_EAGER = True``."""
    conf = current_app.conf
    eager = conf.task_always_eager
    conf.task_always_eager = True
    yield
    conf.task_always_eager = eager


@pytest.fixture
def product(billing_sandbox, transactional_db) -> Product:
    """A published, pushed product with a months-1 cycle priced in XOF (as the page says)."""
    with transaction.atomic():
        product = Product.objects.create(name="Pro", status="published", selected_currencies=[1])
        monthly = BillingCycle.objects.create(product=product, unit="months", frequency=1)
        Price.objects.create(cycle=monthly, currency_id=1, amount=Decimal("10000"))
    product.refresh_from_db()
    assert product.remote_id is not None
    return product


def test_the_page_has_its_examples():
    assert len(example_blocks()) >= 3
    # "Outside pytest": a Django TestCase, collected here as pytest collects any TestCase
    assert any("(TestCase):" in block for block in example_blocks())
    assert len(example_blocks(EVENTS)) == 1  # a handler of a type of one's own, and its test


for _page in (PAGE, EVENTS):
    for _block in example_blocks(_page):
        exec(compile(_block, str(_page), "exec"), globals())  # the page's own code
