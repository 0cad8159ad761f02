"""The systemd install steps only install what exists: this checkout ('.') or a wheel built from it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FILES = [*sorted((ROOT / "systemd").iterdir()), ROOT / "docs" / "systemd.md", ROOT / "deploy" / "README.md"]
PIP_INSTALL = re.compile(r"\bpip install\s+(?P<args>[^#`\n]*)")


def installs(text: str) -> list[str]:
    """The first argument of every `pip install` in `text` that is not an option."""
    found = []
    for match in PIP_INSTALL.finditer(text):
        args = [a for a in match.group("args").split() if not a.startswith("-")]
        if args:
            found.append(args[0])
    return found


def test_every_pip_install_names_the_checkout_or_a_wheel():
    seen = 0
    for path in FILES:
        for target in installs(path.read_text()):
            seen += 1
            if path.parent.name == "deploy" and target == "mypackage":  # the handler image's own package
                continue
            assert target == "." or target.endswith(".whl"), f"{path.relative_to(ROOT)}: pip install {target}"
    assert seen >= 3  # the unit, the docs and deploy/README.md each show one


def test_the_check_would_catch_a_package_index_name():
    assert installs("#   /opt/x/venv/bin/pip install spooled-supervisor  your-handler") == ["spooled-supervisor"]
    assert installs("pip install --quiet ./dist/spooled_supervisor-0.1.0-py3-none-any.whl mypackage") == [
        "./dist/spooled_supervisor-0.1.0-py3-none-any.whl"]


def test_the_docs_show_the_units_reload_watchdog_and_stop_settings():
    unit = (ROOT / "systemd" / "spooled-supervisor.service").read_text()
    docs = (ROOT / "docs" / "systemd.md").read_text()
    for key in ("WatchdogSec", "TimeoutStopSec", "KillMode", "NotifyAccess"):
        value = re.search(rf"^{key}=(\S+)", unit, re.M)
        assert value and f"{key}={value.group(1)}" in docs, key
    reload = re.search(r"^ExecReload=\S+ (.*)$", unit, re.M)
    assert reload and f"`python {reload.group(1)}`" in docs


def test_a_wheel_is_installed_from_where_it_was_built():
    """`pip wheel -w DIR` then `pip install ./DIR/x.whl`: the install names the directory the build wrote to."""
    docs = (ROOT / "docs" / "systemd.md").read_text()
    built = re.findall(r"pip wheel [^\n]*?-w (\S+)", docs)
    wheels = [target for target in installs(docs) if target.endswith(".whl")]
    assert built and wheels
    for wheel in wheels:
        assert any(Path(wheel).parent == Path(out) for out in built), (wheel, built)
