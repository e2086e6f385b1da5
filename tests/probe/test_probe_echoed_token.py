"""A billing answer quoting the probe's token: no finding (printed by ``billing_probe``, saved
in its ``--output`` file) holds the token, as the saved raw answers do not."""

import json
import re

import pytest
import responses

from billing_integration.probe import run_probe, save_answers

from .test_probe_safety import a_client

pytestmark = pytest.mark.django_db

TOKEN = "opaque-ACCESS-token-0123456789abcdef"
API = r"http://billing\.test/v1/api/billing"


@responses.activate
def test_no_finding_quotes_the_token(tmp_path):
    responses.post(re.compile(r"http://auth\.test/.*"), json={"access_token": TOKEN})
    echo = {"errors": [{"message": f"refused x-kc-token {TOKEN}", "code": "refused"}]}
    responses.get(re.compile(API + r"/products/.+"), status=404, json=echo)
    responses.get(re.compile(API + r"/products\?.*"), json={"data": []})
    responses.get(re.compile(API + r"/customers.*"), status=500, json={"message": TOKEN})
    responses.get(re.compile(API + r"/subscriptions.*"), json={"data": []})
    report = run_probe(a_client())
    seen = {f.guess: f.seen for f in report.findings}
    assert "HTTP 500" in seen["data_wrapping"] and "[redacted]" in seen["data_wrapping"]
    assert "[redacted]" in seen["error_shape"]
    saved = save_answers(report, tmp_path / "probe.json").read_text()
    assert TOKEN not in saved
    assert TOKEN not in json.dumps(report.as_dict())
