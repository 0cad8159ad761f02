"""The shipped Kubernetes manifests (deploy/k8s/) read as data: every document of a file, the one of a kind,
a container's environment by name and a flag's value in its arguments."""

from __future__ import annotations

import copy
import functools
from pathlib import Path

import yaml

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"


def load_docs(name: str) -> list[dict]:
    """The documents of deploy/k8s/`name`, a copy of its own for each caller (to change at will)."""
    return copy.deepcopy(_parsed(name))


@functools.cache
def _parsed(name: str) -> list[dict]:
    """Parsed once a session: a test that computes replicas for a hundred samples reads the file each time."""
    return [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]


def one(name: str, kind: str) -> dict:
    (doc,) = [d for d in load_docs(name) if d["kind"] == kind]
    return doc


def env_of(c: dict) -> dict:
    return {e["name"]: e for e in c.get("env", [])}


def flag(args: list[str], name: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == name:
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None
