"""Command line entry: picks a subcommand and hands it its arguments.

`run` is the default subcommand, so `python -m supervisor --procs 8 ...` runs the daemon.
Each subcommand lives in its own module and exposes `main(argv) -> int`; its argument parser comes from
`parser`, which names the program the way it was invoked and answers `--version`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from importlib import metadata
from typing import Any

DISTRIBUTION = "spooled-supervisor"
SCRIPT = "spooled-supervisor"  # the console script pyproject.toml installs

SUBCOMMANDS = {
    "run": ("supervisor.commands.run", "run the supervisor daemon (default)"),
    "dev-server": ("supervisor.devserver.cli", "serve the Spooled REST API from SQLite"),
    "dev": ("supervisor.commands.dev", "your handler + a local dev server with a web UI, reloading on save"),
    "demo": ("supervisor.commands.demo", "dev server + demo jobs + daemon, with live progress"),
    "enqueue": ("supervisor.commands.enqueue", "submit jobs to a Spooled API"),
    "status": ("supervisor.commands.status", "show a running daemon's children from its health port"),
    "drain": ("supervisor.commands.drain", "ask the local daemon to drain and wait until it exits (preStop)"),
    "reload": ("supervisor.commands.reload", "replace a running daemon's children (systemd's ExecReload=)"),
}


def version() -> str:
    """The installed package's version (pyproject.toml's), or the source tree's when it is not installed."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        from supervisor import __version__

        return __version__


def program() -> str:
    """The program's name as the user typed it: the console script's name, or `python -m supervisor`."""
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if name.startswith(SCRIPT) and not name.endswith(".py"):
        return name
    return f"{os.path.basename(sys.executable) or 'python'} -m supervisor"


def parser(subcommand: str, cls: type[argparse.ArgumentParser] = argparse.ArgumentParser,
           **kwargs: Any) -> argparse.ArgumentParser:
    """An argument parser for `subcommand`, named as invoked (`PROGRAM SUBCOMMAND`), with `--version`. Flags
    are taken as spelled in full only: an abbreviation is an unknown flag, never a guess at another."""
    kwargs.setdefault("allow_abbrev", False)
    p = cls(prog=f"{program()} {subcommand}", **kwargs)
    add_version(p)
    return p


def add_version(p: argparse.ArgumentParser) -> None:
    p.add_argument("--version", action="version", version=f"{DISTRIBUTION} {version()}",
                   help="print the version and exit")


def usage() -> str:
    prog = program()
    return (f"usage: {prog} [SUBCOMMAND] [options]\n       {prog} --version\n\nsubcommands:\n"
            + "".join(f"  {name:<11} {help_}\n" for name, (_, help_) in SUBCOMMANDS.items())
            + f"\n`{prog} SUBCOMMAND --help` explains each one's options.\n")


def path_as_python_m() -> None:
    """The installed script finds the user's code as `python -m supervisor` does: that puts the current
    directory first on sys.path, a console script puts its own bin directory there instead. The children,
    the forkserver and the import probe get this sys.path."""
    if program() != f"{os.path.basename(sys.executable) or 'python'} -m supervisor":
        cwd = os.getcwd()
        if cwd not in sys.path and "" not in sys.path:
            sys.path.insert(0, cwd)


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        path_as_python_m()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help") and len(argv) == 1:
        sys.stdout.write(usage())
        return 0
    if argv and argv[0] in ("-V", "--version"):
        sys.stdout.write(f"{DISTRIBUTION} {version()}\n")
        return 0
    name = "run"
    if argv and argv[0] in SUBCOMMANDS:
        name = argv.pop(0)
    elif argv and not argv[0].startswith("-"):
        sys.stderr.write(f"{program()}: error: unknown subcommand {argv[0]!r}; "
                         f"choose one of {', '.join(SUBCOMMANDS)}\n")
        return 2
    try:
        module = importlib.import_module(SUBCOMMANDS[name][0])
        return int(module.main(argv) or 0)
    except KeyboardInterrupt:  # Ctrl-C where a command has nothing more to say: no traceback
        sys.stderr.write("interrupted\n")
        return 130
