"""`python -m supervisor.child.probe MOD:ATTR FD [INIT]`: import the handler once, in a process of its own,
and write what the daemon needs before it starts (the SDK worker's facts, or the boot error) to descriptor FD.
With INIT (--child-init's module:function) it also imports that and checks it is callable, without calling
it (`init_error`: one line, when it is not usable).

The daemon runs this when --queue is not given, to read the queue from the handler's SDK worker, and when
--child-init is set: the daemon itself never imports user code.
"""

from __future__ import annotations

import os
import sys

import orjson

from supervisor.child import logs
from supervisor.child.handler import load_handler
from supervisor.child.lifecycle import init_problem
from supervisor.child.main import BOOT_ERROR_EXIT, boot_error_text


def main(argv: list[str]) -> int:
    spec, fd = argv[0], int(argv[1])
    os.set_inheritable(fd, False)  # nothing the handler's module starts may hold the daemon's read open
    answer: dict[str, object]
    logs.install()
    try:
        handler = load_handler(spec)
    except BaseException as exc:
        answer, code = {"error": boot_error_text(exc)}, BOOT_ERROR_EXIT
    else:
        answer, code = {"about": handler.about}, 0
        problem = init_problem(argv[2]) if len(argv) > 2 else None
        if problem is not None:
            answer, code = {"init_error": problem}, BOOT_ERROR_EXIT
    with os.fdopen(fd, "wb") as out:
        out.write(orjson.dumps(answer, default=str))
    return code


if __name__ == "__main__":
    sys.stdout.flush()
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # whatever threads the user's module started must not hold the daemon's start-up
