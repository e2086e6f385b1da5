"""``mapping.products.features_from_remote``: the service's features array, whose element
shape the interface does not document, read tolerantly and failing closed."""

from __future__ import annotations

import pytest

from billing_integration.mapping.products import features_from_remote, from_remote


@pytest.mark.parametrize(
    ("features", "expected"),
    [
        (["sso", "API "], {"sso": None, "api": None}),
        (["seats:5", "seats:3", "storage:lots"], {"seats": 5, "storage": None}),
        ([{"name": "sso"}, {"key": "seats", "limit": 10}], {"sso": None, "seats": 10}),
        (
            [{"code": "seats", "value": "7"}, {"name": "api", "value": True}],
            {"seats": 7, "api": None},
        ),
        ([{"name": None, "code": "reports"}], {"reports": None}),
        ([{"name": "seats", "value": 2.0}, {"name": "x", "value": 2.5}], {"seats": 2, "x": None}),
        ([{"name": "seats", "value": -1}], {"seats": None}),
        ([{"name": "seats", "value": 3}, {"name": "SEATS", "value": 8}, "seats"], {"seats": 8}),
        # withdrawn: false, "false", enabled false or "false"
        (
            [
                {"name": "sso", "value": False},
                {"name": "api", "enabled": False},
                {"name": "x", "limit": "false"},
                "y:false",
                {"name": "reports", "enabled": "false"},
                {"name": "seats", "enabled": " False", "limit": 5},
                # false in any value field withdraws, beside a number in another
                {"key": "a", "limit": 0, "value": False},
                {"key": "b", "limit": 5, "value": "false"},
                {"key": "c", "value": 3, "quantity": False},
            ],
            {},
        ),
        (
            [{"name": "sso", "enabled": True}, {"name": "api", "enabled": "true"}],
            {"sso": None, "api": None},
        ),
        (
            [{"name": "sso", "enabled": 1}, {"name": "api", "enabled": " YES", "limit": 3}],
            {"sso": None, "api": 3},
        ),
        # an "enabled" that does not say yes withholds (fails closed): 0, null, "no", "off", text
        (
            [
                {"name": "sso", "enabled": 0},
                {"name": "api", "enabled": None},
                {"name": "x", "enabled": "0"},
                {"name": "y", "enabled": "no"},
                {"name": "z", "enabled": "off"},
                {"name": "seats", "enabled": "disabled", "limit": 5},
                {"name": "w", "enabled": []},
            ],
            {},
        ),
        # nothing usable
        ([None, 3, [], {}, {"id": "3f0c"}, {"name": ""}, " ", {"name": 5}], {}),
    ],
)
def test_element_shapes(features, expected):
    assert features_from_remote({"features": features}) == expected


@pytest.mark.parametrize(
    "data",
    [None, [], "sso", {}, {"features": None}, {"features": "sso"}, {"features": {"sso": True}}],
)
def test_no_features_array_gives_none(data):
    assert features_from_remote(data) == {}


def test_from_remote_sets_no_feature_field():
    """The features stay in remote_data (the whole resource), read at access time."""
    fields = from_remote(
        {
            "id": "7b0f5ad6-3c2e-4a55-9b8c-2b1c5b0e4e11",
            "name": "P",
            "subscription_blueprint": "bp",
            "features": ["sso"],
        }
    )
    assert fields["remote_data"]["features"] == ["sso"]
    assert not any("feature" in name for name in fields)
