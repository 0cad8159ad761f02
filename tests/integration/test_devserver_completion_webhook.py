"""A job's `completion_webhook` is checked as a webhook's URL is: a header-injecting, non-http or hostless
value is 400 `invalid_url` on create and on each bulk item, and nothing is stored."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.timeout(30)

BAD = ["http://127.0.0.1:1/x HTTP/1.1\r\nX-Injected: 1\r\n\r\n", "javascript:alert(1)", "http:///nohost",
       "http://127.0.0.1:1/<b>x</b> y"]


def test_a_bad_completion_webhook_is_refused_and_a_good_one_kept(dev_server):
    for url in BAD:
        r = dev_server.request("POST", "/api/v1/jobs", json={"queue_name": "cw", "payload": {},
                                                             "completion_webhook": url})
        assert r.status_code == 400 and r.json()["code"] == "VALIDATION_ERROR", (url, r.text)
        assert "completion_webhook" in r.text
    bulk = dev_server.request("POST", "/api/v1/jobs/bulk", json={"queue_name": "cw", "jobs": [
        {"payload": {}, "completion_webhook": BAD[0]}, {"payload": {}, "completion_webhook": "http://127.0.0.1:9/ok"}]})
    assert bulk.status_code == 200, bulk.text
    answer = bulk.json()
    assert answer["success_count"] == 1 and answer["failure_count"] == 1, answer
    jobs = dev_server.request("GET", "/api/v1/jobs?queue_name=cw").json()
    assert len(jobs) == 1
