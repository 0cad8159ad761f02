"""Command line entry: picks a subcommand and hands it its arguments.

`run` is the default subcommand, so `python -m supervisor --procs 8 ...` runs the daemon.
Each subcommand lives in its own module and exposes `main(argv) -> int`.
"""

from __future__ import annotations

import importlib
import sys

SUBCOMMANDS = {
    "run": ("supervisor.commands.run", "run the supervisor daemon (default)"),
    "dev-server": ("supervisor.devserver.cli", "serve the Spooled REST API from SQLite"),
    "demo": ("supervisor.commands.demo", "dev server + demo jobs + daemon, with live progress"),
    "enqueue": ("supervisor.commands.enqueue", "submit jobs to a Spooled API"),
    "status": ("supervisor.commands.status", "show a running daemon's children from its health port"),
    "drain": ("supervisor.commands.drain", "ask the local daemon to drain and wait until it exits (preStop)"),
}

USAGE = "usage: python -m supervisor [SUBCOMMAND] [options]\n\nsubcommands:\n" + "".join(
    f"  {name:<11} {help_}\n" for name, (_, help_) in SUBCOMMANDS.items()
) + "\n`python -m supervisor SUBCOMMAND --help` explains each one's options.\n"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help") and len(argv) == 1:
        sys.stdout.write(USAGE)
        return 0
    name = "run"
    if argv and argv[0] in SUBCOMMANDS:
        name = argv.pop(0)
    elif argv and not argv[0].startswith("-"):
        sys.stderr.write(f"error: unknown subcommand {argv[0]!r}; choose one of {', '.join(SUBCOMMANDS)}\n")
        return 2
    module = importlib.import_module(SUBCOMMANDS[name][0])
    return int(module.main(argv) or 0)
