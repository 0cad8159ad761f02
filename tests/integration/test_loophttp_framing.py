"""The parent loop's client against a misbehaving server: every answer in tests/support/http_cases/responses/
ends in a correct result or an Unavailable (retried like any network error), and the next call is served."""

from __future__ import annotations

import pytest
from support.fake_http import MisbehavingServer, all_cases
from support.loop_client import make_client, run_until_done

from supervisor import exactjson
from supervisor.client import rest as api

CASES = all_cases()
KEY = "sp_test_framing_0123456789"


def test_the_case_files_are_well_formed():
    assert len(CASES) >= 25
    for case in CASES:
        assert case.meta.get("expect") in ("answered", "unavailable"), case.name
        assert case.meta.get("why"), case.name
        if case.meta["expect"] == "answered":
            assert "result" in case.meta and case.meta.get("closes") in ("yes", "no"), case.name


@pytest.mark.timeout(30)
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_an_answer_ends_in_a_result_or_a_retryable_error_and_the_next_call_is_served(case):
    with MisbehavingServer(case) as server:
        spooled, client, sel, wake_r = make_client(server.url, KEY, timeout=5.0)
        try:
            client.submit("first", spooled.claim_call("q", "w", 1, 30))
            [(tag, result, error)] = run_until_done(client, sel, wake_r)
            assert tag == "first"
            if case.meta["expect"] == "answered":
                assert error is None, f"{case.name}: {error}"
                assert result == exactjson.loads(case.meta["result"])
                if result:
                    assert type(result[0]["payload"]["n"]) is int  # exact, never a float
            else:
                assert isinstance(error, api.Unavailable) and error.retryable, f"{case.name}: {error!r}"
                assert error.code == case.meta.get("code", error.code), f"{case.name}: {error}"
                assert error.status == int(case.meta.get("status", "0"))
                assert KEY not in str(error)
            closes = case.meta.get("closes", "yes") == "yes"
            assert (client.conns == []) == closes, f"{case.name}: connections {[c.state for c in client.conns]}"

            client.submit("next", spooled.claim_call("q", "w", 1, 30))
            [(tag, result, error)] = run_until_done(client, sel, wake_r)
            assert (tag, result, error) == ("next", [], None)
            assert server.connections == (2 if closes else 1)
            assert len(server.requests) == 2
        finally:
            client.close()
            sel.close()
