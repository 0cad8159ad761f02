"""A child forgets the atexit entries it inherited from the forkserver (the daemon's and its libraries') and keeps
those the handler's module registered while the forkserver preloaded it. Run in a fresh interpreter: the test
process's own atexit entries are not touched."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(30)

SCRIPT = """
import atexit
from supervisor.child import lifecycle, preload

atexit.register(print, "inherited: must not run")
with preload.recording_exits():
    atexit.register(print, "the handler's, registered at preload")
lifecycle.forget_inherited_exits()
atexit.register(print, "the child's own")
"""


def test_only_the_handlers_preloaded_entries_and_the_childs_own_run_at_exit():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=20, check=True).stdout
    assert out.splitlines() == ["the child's own", "the handler's, registered at preload"]
