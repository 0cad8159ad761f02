"""A module that reads the API key without insisting on it (`os.getenv`), then builds a client lazily."""

import os

API_KEY = os.getenv("SPOOLED_API_KEY")


def handle_job(ctx):
    return {"has_key": API_KEY is not None}
