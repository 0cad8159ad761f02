"""On a platform other than Linux, `run` and `dev` exit 2 with one line saying what to use instead, before they
read a flag or start anything."""

from __future__ import annotations

import sys

import pytest

from supervisor.commands import dev, run


@pytest.mark.timeout(10)
@pytest.mark.parametrize("command", [run.main, dev.main])
@pytest.mark.parametrize("platform", ["darwin", "win32"])
def test_another_platform_exits_2_with_one_line(command, platform, monkeypatch, capsys):
    monkeypatch.setattr(sys, "platform", platform)
    assert command(["--handler", "app:handle", "--queue", "q"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Linux only" in err and "container image" in err and "WSL2" in err, err
