"""Handlers that fail in the user's own code, a few calls deep, for the error-text tests
(tests/unit/test_child_failures.py, tests/integration/test_user_errors.py)."""

from __future__ import annotations

import asyncio
import json


def parse_width(payload):
    return int(payload["width"])  # KeyError or ValueError here: the user's line


def handle(ctx):
    return {"width": parse_width(ctx.payload) * 2}


async def handle_async(ctx):
    await asyncio.sleep(0)
    return {"width": parse_width(ctx.payload)}


def handle_json(ctx):
    return json.loads(ctx.payload["text"])  # the stdlib raises: its frames stay, after the user's
