"""API keys with queue scopes and expiry, and JWTs from auth/login, against the real dev server: the SDK's
api_keys and auth resources, a revoked or expired key refused at once on REST, gRPC and an open event
stream, a JWT accepted on REST and refused on gRPC, and tokens tampered with, reused or revoked."""

from __future__ import annotations

import datetime

import pytest
import requests
from conftest import wait_until
from spooled import SpooledClient
from spooled.errors import AuthenticationError, SpooledError
from support.grpc_support import start_server

pytestmark = pytest.mark.timeout(60)
grpc = pytest.importorskip("grpc")

from supervisor.proto import spooled_pb2, spooled_pb2_grpc  # noqa: E402


@pytest.fixture()
def server(tmp_path):
    s = start_server(tmp_path)
    yield s
    s.stop()


def sdk(server, key: str | None = None) -> SpooledClient:
    return SpooledClient(api_key=key or server.api_key, base_url=server.url)


def grpc_stats(server, key: str):
    with grpc.insecure_channel(server.grpc_address) as channel:
        stub = spooled_pb2_grpc.QueueServiceStub(channel)
        return stub.GetQueueStats(spooled_pb2.GetQueueStatsRequest(queue_name="q"), timeout=5,
                                  metadata=[("x-api-key", key)])


def test_keys_are_created_listed_updated_and_a_revoked_one_is_refused_at_once(server):
    c = sdk(server)
    made = c.api_keys.create({"name": "ci"})
    assert made.key.startswith("sk_test_") and made.name == "ci" and made.expires_at is None
    assert {k.id for k in c.api_keys.list()} >= {made.id}
    assert c.api_keys.get(made.id).name == "ci" and c.api_keys.get(made.id).is_active
    c.api_keys.update(made.id, {"name": "ci-renamed"})
    assert c.api_keys.get(made.id).name == "ci-renamed"
    new = sdk(server, made.key)
    assert new.dashboard.get().system.environment == "development"  # the new key works, REST and gRPC
    assert grpc_stats(server, made.key).queue_name == "q"
    events = requests.get(server.url + "/api/v1/events", headers={"Authorization": f"Bearer {made.key}"},
                          stream=True, timeout=10)
    assert events.status_code == 200
    wait_until(lambda: server.request("GET", "/_dev/events").json()["streams"] == 1, timeout=5, what="stream")

    c.api_keys.delete(made.id)
    r = server.request("GET", "/api/v1/jobs", key=made.key)  # at once: no cache keeps it
    assert r.status_code == 401 and r.json() == {"code": "UNAUTHORIZED", "message": "API key is inactive"}
    with pytest.raises(grpc.RpcError) as info:
        grpc_stats(server, made.key)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED and info.value.details() == "API key is inactive"
    wait_until(lambda: server.request("GET", "/_dev/events").json()["streams"] == 0, timeout=5,
               what="the revoked key's stream to end")
    events.close()
    assert not c.api_keys.get(made.id).is_active
    assert server.request("DELETE", "/api/v1/api-keys/no-such-key").status_code == 404
    assert sdk(server).jobs.list() is not None  # the dev server's own key is untouched


def test_an_expired_key_is_refused_once_its_time_comes(server):
    soon = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=2)
    made = sdk(server).api_keys.create({"name": "short", "expires_at": soon})
    assert made.expires_at is not None
    assert server.request("GET", "/api/v1/jobs", key=made.key).status_code == 200
    wait_until(lambda: server.request("GET", "/api/v1/jobs", key=made.key).status_code == 401, timeout=10,
               what="the key to expire")
    assert server.request("GET", "/api/v1/jobs", key=made.key).json()["message"] == "API key has expired"
    with pytest.raises(AuthenticationError):
        sdk(server).auth.login({"api_key": made.key})


def test_a_queue_scoped_key_stays_in_its_queues(server):
    scoped = sdk(server).api_keys.create({"name": "mail-only", "queues": ["mail"]}).key
    s = sdk(server, scoped)
    assert s.jobs.create({"queue_name": "mail", "payload": {}}).id
    for method, path, body in (("POST", "/api/v1/jobs", {"queue_name": "billing", "payload": {}}),
                               ("POST", "/api/v1/jobs/claim", {"queue_name": "billing", "worker_id": "w"}),
                               ("GET", "/api/v1/queues/billing/stats", None),
                               ("POST", "/api/v1/queues/billing/pause", None),
                               ("GET", "/api/v1/api-keys", None),
                               ("GET", "/api/v1/organizations/usage", None)):
        r = server.request(method, path, json=body, key=scoped)
        assert r.status_code == 403 and r.json()["code"] == "ACCESS_DENIED", (path, r.text)
    assert "billing" in server.request("POST", "/api/v1/jobs", json={"queue_name": "billing", "payload": {}},
                                       key=scoped).json()["message"]
    assert server.request("GET", "/api/v1/queues/mail/stats", key=scoped).status_code == 200
    for bad in ({"name": ""}, {"name": "x", "queues": "mail"}, {"name": "x", "queues": ["bad name"]},
                {"name": "x", "permissions": ["admin"]}, {"name": "x", "expires_at": "tomorrow"}):
        r = server.request("POST", "/api/v1/api-keys", json=bad)
        assert r.status_code in (400, 422) and r.json()["code"] in ("VALIDATION_ERROR", "INVALID_JSON"), r.text


def test_login_gives_a_jwt_accepted_on_rest_and_refused_on_grpc(server):
    c = sdk(server)
    login = c.auth.login({"api_key": server.api_key})
    assert login.token_type == "Bearer" and login.expires_in == 86400 and login.refresh_expires_in == 86400 * 24
    assert login.access_token.startswith("eyJ")
    jwt = SpooledClient(access_token=login.access_token, base_url=server.url)
    made = jwt.jobs.create({"queue_name": "q", "payload": {"via": "jwt"}})
    assert c.jobs.get(made.id).payload == {"via": "jwt"}
    me = jwt.auth.me()
    assert me.organization_id and me.organization and me.organization.slug == "default"
    assert me.expires_at > me.issued_at
    v = c.auth.validate({"token": login.access_token})
    assert v.valid and v.organization_id == me.organization_id
    assert c.auth.validate({"token": login.access_token + "x"}).valid is False
    with pytest.raises(grpc.RpcError) as info:
        grpc_stats(server, login.access_token)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    r = server.request("GET", "/api/v1/auth/me")  # an API key is not a JWT here
    assert r.status_code == 401 and r.json()["code"] == "UNAUTHORIZED"

    refreshed = c.auth.refresh({"refresh_token": login.refresh_token})
    assert refreshed.access_token != login.access_token
    assert server.request("GET", "/api/v1/jobs", key=refreshed.access_token).status_code == 200
    r = server.request("GET", "/api/v1/jobs", key=login.refresh_token)  # a refresh token is no access token
    assert r.status_code == 401 and r.json()["message"] == "Invalid token type"
    with pytest.raises(AuthenticationError):
        c.auth.refresh({"refresh_token": login.access_token})

    SpooledClient(access_token=login.access_token, base_url=server.url).auth.logout(login.refresh_token)
    r = server.request("GET", "/api/v1/jobs", key=login.access_token)
    assert r.status_code == 401 and r.json()["message"] == "Token has been revoked"
    with pytest.raises(AuthenticationError):
        c.auth.refresh({"refresh_token": login.refresh_token})
    assert c.auth.validate({"token": login.access_token}).valid is False
    assert server.request("GET", "/api/v1/jobs", key=refreshed.access_token).status_code == 200


def test_a_jwt_dies_with_its_key_and_bad_logins_are_refused(server):
    c = sdk(server)
    made = c.api_keys.create({"name": "temp"})
    token = c.auth.login({"api_key": made.key}).access_token
    assert server.request("GET", "/api/v1/jobs", key=token).status_code == 200
    c.api_keys.delete(made.id)
    r = server.request("GET", "/api/v1/jobs", key=token)
    assert r.status_code == 401 and r.json()["message"] == "API key has been revoked"
    forged = token[: token.rindex(".") + 1] + "A" * 43
    assert server.request("GET", "/api/v1/jobs", key=forged).json()["message"] == "Invalid token"
    for bad in ({"api_key": "sp_test_not_a_key"}, {"api_key": made.key}):
        r = server.request("POST", "/api/v1/auth/login", json=bad, key="ignored")
        assert r.status_code == 401 and r.json()["code"] == "UNAUTHORIZED", r.text
    r = server.request("POST", "/api/v1/auth/login", json={"api_key": "short"})
    assert r.status_code == 400 and r.json()["code"] == "VALIDATION_ERROR"
    r = server.request("POST", "/api/v1/auth/login", json={})
    assert r.status_code == 422 and r.json()["details"][0]["code"] == "missing_field"
    with pytest.raises(SpooledError):
        SpooledClient(api_key=server.api_key, base_url=server.url).auth.logout()  # an API key is no JWT


def test_a_token_whose_key_is_revoked_is_neither_valid_nor_me_and_a_refresh_token_is_not_me(server):
    c = sdk(server)
    made = c.api_keys.create({"name": "temp"})
    pair = c.auth.login({"api_key": made.key})
    me = requests.get(server.url + "/api/v1/auth/me", headers={"Authorization": f"Bearer {pair.refresh_token}"},
                      timeout=10)
    assert me.status_code == 401  # a refresh token is no access token
    ok = requests.get(server.url + "/api/v1/auth/me", headers={"Authorization": f"Bearer {pair.access_token}"},
                      timeout=10)
    assert ok.status_code == 200 and ok.json()["api_key_id"] == made.id
    c.api_keys.delete(made.id)
    r = server.request("POST", "/api/v1/auth/validate", json={"token": pair.access_token})
    assert r.status_code == 200 and r.json() == {"valid": False, "error": "API key has been revoked"}
    me = requests.get(server.url + "/api/v1/auth/me", headers={"Authorization": f"Bearer {pair.access_token}"},
                      timeout=10)
    assert me.status_code == 401 and me.json()["code"] == "UNAUTHORIZED"
