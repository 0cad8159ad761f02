"""Small decisions of `dev` and `--watch`, in-process: which saves count, which running `dev` a command trusts,
and the port range."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from supervisor.commands import dev, watch

pytestmark = pytest.mark.timeout(10)


@pytest.mark.parametrize(("path", "counts"), [
    ("/home/u/proj/app.py", True),
    ("/home/u/proj/app.txt", False),
    ("/home/u/proj/.venv/lib/site.py", False),        # an ignored folder below the watched root
    ("/home/u/proj/pkg/__pycache__/app.py", False),
    ("/srv/venv/proj/app.py", True),                  # the root itself lies in a folder named venv
])
def test_a_save_counts_by_the_folders_below_the_watched_root(path, counts):
    roots = [Path("/srv/venv/proj"), Path("/home/u/proj")]
    assert watch._python_file(path, roots) is counts


def test_a_package_installed_in_a_venv_is_watched_when_it_is_the_root():
    root = Path("/home/u/proj/.venv/lib/python3.11/site-packages/mypkg")
    assert watch._python_file(str(root / "jobs.py"), [root])


def _state(folder: Path, mode: int) -> Path:
    (folder / ".spooled").mkdir()
    path = folder / ".spooled" / "dev.json"
    path.write_text(json.dumps({"pid": os.getpid(), "url": "http://127.0.0.1:1"}))
    path.chmod(mode)
    return path


def test_a_running_dev_is_found_from_a_folder_below(tmp_path):
    _state(tmp_path, 0o600)
    below = tmp_path / "a" / "b"
    below.mkdir(parents=True)
    assert dev.find_running(str(below))["url"] == "http://127.0.0.1:1"


def test_a_state_file_anyone_may_write_is_not_trusted(tmp_path):
    _state(tmp_path, 0o666)
    assert dev.find_running(str(tmp_path)) is None


@pytest.mark.parametrize("port", ["70000", "-1"])
def test_a_port_out_of_range_exits_2_with_one_line(port, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "app.py").write_text("def handle(ctx):\n    return 1\n")
    assert dev.main(["--handler", "app:handle", "--queue", "q", "--port", port]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--port must be 0-65535" in err, err
    assert not (tmp_path / ".spooled").exists()
