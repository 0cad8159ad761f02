"""The organization routes beside `POST /organizations`: list (the caller's own), usage against the plan's
limits, and the incoming-webhook token. Usage reports the limits of the organization's plan tier as the
server defines them (the dev server enforces only what its flags set; billing is left out on purpose)."""

from __future__ import annotations

import time
import uuid

from . import overview_store
from .errors import HttpError, validation
from .handlers import body
from .keys_store import require_unrestricted

# The server's plan tiers: (display name, jobs/day, active jobs, queues, workers, api keys, schedules,
# workflows, webhooks, payload bytes, requests/s, burst, job retention days, history retention days).
PLANS = {
    "free": ("Free", 1_000, 10, 2, 1, 2, 1, 0, 1, 64 * 1024, 5, 10, 3, 1),
    "starter": ("Starter", 10_000, 500, 10, 5, 5, 10, 5, 5, 256 * 1024, 25, 50, 14, 7),
    "pro": ("Pro", 100_000, 5_000, 50, 25, 25, 50, 25, 20, 1024 * 1024, 100, 200, 30, 30),
    "enterprise": ("Enterprise", None, None, None, None, None, None, None, None, 5 * 1024 * 1024, 500, 1000, 90, 90),
}
RESOURCES = ("jobs_per_day", "active_jobs", "queues", "workers", "api_keys", "schedules", "workflows", "webhooks")
USAGE_NAMES = {"jobs_per_day": "jobs_today"}


def plan_limits(tier: str) -> dict:
    name, *values = PLANS.get(tier, PLANS["free"])
    fields = ("max_" + r for r in RESOURCES)
    limits: dict = {"tier": tier if tier in PLANS else "free", "display_name": name}
    limits.update(zip(fields, values[:8], strict=True))
    limits.update(zip(("max_payload_size_bytes", "rate_limit_requests_per_second", "rate_limit_burst",
                       "job_retention_days", "history_retention_days"), values[8:], strict=True))
    return limits


def usage_info(store, org: str, now: float) -> dict:
    """The server's usage answer: each resource's count, limit, percentage and whether the plan disables
    it, and a warning per resource at or over the plan's threshold (50% on free, 80% above)."""
    tier = store.org_plan(org)
    limits = plan_limits(tier)
    counts = overview_store.resource_counts(store, org, now)
    threshold = 50.0 if limits["tier"] == "free" else 80.0
    usage, warnings = {}, []
    for resource in RESOURCES:
        current, limit = counts[resource], limits["max_" + resource]
        pct = None if limit is None else (current / limit * 100.0 if limit else (100.0 if current else 0.0))
        if pct is not None and limit:
            spoken = resource.replace("_", " ")
            if pct >= 100.0:
                warnings.append({"resource": resource, "message": f"{spoken} limit reached", "severity": "critical"})
            elif pct >= threshold:
                warnings.append({"resource": resource, "message": f"{spoken} at {pct:.0f}% of limit",
                                 "severity": "warning"})
        usage[USAGE_NAMES.get(resource, resource)] = {
            "current": current, "limit": limit, "percentage": pct,
            "is_disabled": resource == "workflows" and limit == 0}
    return {"plan": limits["tier"], "plan_display_name": limits["display_name"], "limits": limits, "usage": usage,
            "warnings": warnings}


def list_orgs(app, req):
    org = overview_store.organization(app.store, req.org)
    return 200, [{k: org[k] for k in ("id", "name", "slug", "plan_tier", "created_at")}], None


def get_org(app, req):
    """The caller's own organization; a queue-scoped key does not see the webhook token in its settings."""
    if req.params["id"] != req.org:
        raise HttpError(404, "NOT_FOUND", f"Organization {req.params['id']} not found")
    org = overview_store.organization(app.store, req.org)
    if not getattr(req.key, "unrestricted", True):
        org["settings"].pop("webhook_token", None)
    return 200, org, None


def usage(app, req):
    require_unrestricted(req, "view organization usage")
    return 200, usage_info(app.store, req.org, time.time()), None


def _webhook_answer(req, token: str) -> dict:
    host = req.headers.get("host") or "localhost"
    return {"webhook_token": token, "webhook_url": f"http://{host}/api/v1/webhooks/{req.org}/custom"}


def get_webhook_token(app, req):
    require_unrestricted(req, "read organization webhook tokens")
    return 200, _webhook_answer(req, overview_store.webhook_token(app.store, req.org, time.time())), None


def regenerate_webhook_token(app, req):
    require_unrestricted(req, "regenerate organization webhook tokens")
    token = overview_store.webhook_token(app.store, req.org, time.time(), regenerate=True)
    return 200, _webhook_answer(req, token), None


def clear_webhook_token(app, req):
    """Refused, as the server refuses it: a token is rotated, never removed."""
    raise HttpError(400, "VALIDATION_ERROR", "Clearing the webhook token is not allowed. Use "
                    "/organizations/webhook-token/regenerate to rotate it.")


def _slug_problem(slug: str) -> str | None:
    if not slug or len(slug) > 100:
        return "Slug must be 1-100 characters"
    if not all("0" <= c <= "9" or "a" <= c <= "z" or c == "-" for c in slug):
        return "Slug can only contain lowercase letters, digits, and hyphens"
    if slug[0] == "-" or slug[-1] == "-":
        return "Slug cannot start or end with a hyphen"
    return None


def _taken(store, slug: str) -> bool:
    return bool(store._read("SELECT 1 FROM organizations WHERE slug=?", (slug,)))


def check_slug(app, req):
    """`GET /organizations/check-slug?slug=`: whether a new organization could take it (public)."""
    slug = (req.query.get("slug") or [""])[-1]
    problem = _slug_problem(slug)
    if problem:
        return 200, {"available": False, "valid": False, "error": problem}, None
    if _taken(app.store, slug):
        return 200, {"available": False, "valid": True, "suggestion": f"{slug}-{uuid.uuid4().hex[:6]}"}, None
    return 200, {"available": True, "valid": True}, None


def generate_slug(app, req):
    """`POST /organizations/generate-slug {"name"}`: a free slug made from a name, as the server makes it."""
    name = body(req).str("name", True, 0, 100_000).strip()
    if not name or len(name.encode()) > 200:
        raise validation("name", "Name must be 1-200 characters", "length")
    slug = "-".join(p for p in "".join(c if c.isascii() and c.isalnum() else "-" for c in name.lower()).split("-")
                    if p)
    if "0" <= slug[:1] <= "9":
        slug = "org-" + slug
    if len(slug) > 80:
        slug = slug[:80].rstrip("-")
    if _taken(app.store, slug):
        slug = f"{slug}-{uuid.uuid4().hex[:6]}"
    return 200, {"slug": slug}, None
