"""The README's code for host projects runs here as written (``tests/install/readme.py``
extracts it): the test file of "In your own tests" is this module's test, and the product
created in "Installing into your project" is pushed. ``tests/install/test_new_project.py``
runs the same code in a new project."""

from __future__ import annotations

import pytest

from billing_integration.models import Product
from tests.conftest import mark_pushed

from .install import readme

# The README's host test file, defined in this module (pytest collects what it defines).
exec(compile(readme.file_block("test_billing.py"), "README.md: test_billing.py", "exec"))


@pytest.mark.django_db
def test_the_readme_product_is_pushed_whole(billing_sandbox, billing_inline):
    exec(compile(readme.shell_code(), "README.md: manage.py shell", "exec"), {})

    product = Product.objects.get(name="Pro")
    assert product.sync_state == "synced" and product.selected_currencies == [1]
    [call] = billing_sandbox.requests("create_product")
    assert call["status"] == 200
    assert call["body"]["selected_currencies"] == ["1"]
    [cycle] = call["body"]["subscription_blueprint"]["billing_cycles"]
    assert cycle["prices"] == [{"currency": 1, "amount": 10000}]


@pytest.mark.django_db
def test_the_readme_checkout_button_renders_as_written():
    """The template block loads the tag library it uses and names its product, so it renders
    pasted as it is into any page, with nothing more in its context than the user."""
    import uuid
    from decimal import Decimal

    from django.contrib.auth.models import AnonymousUser
    from django.template import Context, Template

    from billing_integration.models import BillingCycle, Price
    from billing_integration.outbox import from_remote

    [block] = [b for b in readme.blocks() if b.target == "template"]
    assert block.code.startswith("{% load billing %}")
    with from_remote():
        # on sale: pushed (a remote id) and sold in XOF (the button offers what checkout sells)
        product = Product.objects.create(
            name="Pro", status="published", remote_id=uuid.uuid4(), selected_currencies=[1]
        )
        monthly = BillingCycle.objects.create(product=product, unit="months", frequency=1)
        Price.objects.create(cycle=monthly, currency_id=1, amount=Decimal("10000"))
    mark_pushed(product)
    html = Template(block.code).render(Context({"user": AnonymousUser()}))
    assert 'action="/billing/checkout/"' in html and 'method="post"' in html
    assert 'value="months-1"' in html and 'value="XOF"' in html
