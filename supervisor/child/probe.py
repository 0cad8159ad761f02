"""`python -m supervisor.child.probe MOD:ATTR FD [INIT]`: import the handler once, in a process of its own,
and write what the daemon needs before it starts (the SDK worker's facts, or the boot error) to descriptor FD.
With INIT (--child-init's module:function) it also imports that and checks it is callable, without calling
it (`init_error`: one line, when it is not usable).

The daemon runs this when --queue is not given, to read the queue from the handler's SDK worker, and when
--child-init is set; `dev --watch` runs it before each reload. The daemon itself never imports user code:
`ask` is its side of the exchange.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
from dataclasses import dataclass

import orjson

from supervisor.child import logs
from supervisor.child.handler import load_handler
from supervisor.child.lifecycle import init_problem
from supervisor.child.main import BOOT_ERROR_EXIT, boot_error_text


@dataclass(frozen=True)
class Reply:
    """What one probe gave back: its answer (None when it wrote none, or not JSON), and why there is none."""
    answer: dict | None
    late: bool  # no answer within the timeout: the probe was killed
    returncode: int | None


def ask(handler: str, env: dict[str, str], timeout: float, *, init: str | None = None, cwd: str | None = None,
        quiet: bool = False) -> Reply:
    """Run the probe on `handler` (and `init`, --child-init's spec) in a fresh interpreter and read its answer.
    `quiet` sends the probe's own output to /dev/null (a reload in the background), else it goes where ours does."""
    read_end, write_end = os.pipe()
    out = subprocess.DEVNULL if quiet else None
    try:
        proc = subprocess.Popen([sys.executable, "-m", "supervisor.child.probe", handler, str(write_end),
                                 *([init] if init else [])],
                                pass_fds=(write_end,), env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=out)
    finally:
        os.close(write_end)
    with os.fdopen(read_end, "rb") as answers:
        poller = select.poll()  # not select(): a daemon with many children holds descriptors above 1024
        poller.register(answers, select.POLLIN)
        ready = bool(poller.poll(timeout * 1000))
        data = answers.read() if ready else b""
    try:
        proc.wait(timeout=max(1.0, timeout / 10) if ready else 0.0)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    try:
        answer = orjson.loads(data) if data else None
    except orjson.JSONDecodeError:
        answer = None
    return Reply(answer if isinstance(answer, dict) else None, late=not ready, returncode=proc.returncode)


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
