"""The README's code for host projects runs here as written (``tests/install/readme.py``
extracts it): the test file of "In your own tests" is this module's test, and the product
created in "Installing into your project" is pushed. ``tests/install/test_new_project.py``
runs the same code in a new project."""

from __future__ import annotations

import pytest

from billing_integration.models import Product

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
