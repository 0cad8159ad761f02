"""Integers in query strings are read as the server's deserializer reads them: ASCII digits with an optional
sign, inside the field's type. Other scripts' digits (which Python's int() takes), separators and numbers past
the type are a 400 with a clear error on every route that reads one, never a 500 (the fuzzer found
`limit=¹` on the schedules and a 21-digit `offset` on the workflows answered 500)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.timeout(60)

ROUTES = ["/api/v1/jobs?{}", "/api/v1/jobs/dlq?{}", "/api/v1/schedules?{}", "/api/v1/workflows?{}",
          "/api/v1/outgoing-webhooks/{hook}/deliveries?{}"]
BAD = ["limit=%C2%B9", "limit=%D9%A1", "limit=1_0", "limit=%201", "offset=403642146861399474176",
       "offset=9223372036854775808", "limit=%3Cb%3E1%3C%2Fb%3E", "limit=1e3", "limit=0x10"]


@pytest.fixture
def hook(dev_server):
    r = dev_server.request("POST", "/api/v1/outgoing-webhooks", json={
        "name": "h", "url": "http://127.0.0.1:9/x", "events": ["job.created"]})
    assert r.status_code == 201, r.text
    return r.json()["id"]


@pytest.mark.parametrize("route", ROUTES)
def test_a_query_integer_that_is_not_one_is_a_400(dev_server, hook, route):
    for query in BAD:
        if route.startswith("/api/v1/schedules") and query.startswith("offset"):
            query = "limit=" + query.split("=", 1)[1]  # the schedules list reads only a limit
        r = dev_server.request("GET", route.format(query, hook=hook))
        assert r.status_code == 400, (route, query, r.status_code, r.text)
        body = r.json()
        assert body["code"] in ("BAD_REQUEST", "VALIDATION_ERROR") and body["message"], (route, query, body)
        assert "<b>" not in r.text


@pytest.mark.parametrize("route", ROUTES)
def test_plain_integers_still_work(dev_server, hook, route):
    for query in ("limit=5", "limit=%2B5"):
        r = dev_server.request("GET", route.format(query, hook=hook))
        assert r.status_code == 200, (route, query, r.text)


def test_a_slug_with_another_scripts_digits_is_no_valid_slug(dev_server):
    r = dev_server.request("GET", "/api/v1/organizations/check-slug?slug=acme%C2%B2")
    assert r.status_code == 200 and r.json()["valid"] is False
    made = dev_server.request("POST", "/api/v1/organizations", json={"name": "Acme two", "slug": "acme\u00b2"})
    assert made.status_code in (400, 422) and made.json()["code"] == "VALIDATION_ERROR", made.text
