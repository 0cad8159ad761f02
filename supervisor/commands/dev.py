"""`python -m supervisor dev --handler app:handle`: your handler, a local Spooled and its web UI, in one command.

Starts the dev server (this process) and the daemon (a child process) against it, the handler imported from
the current folder. The database persists in .spooled/dev.db (with its own .gitignore: it holds payloads
and the key); the key is the database's own, made on first use and never taken from SPOOLED_API_KEY.
While it runs, .spooled/dev.json tells `enqueue` and `status` (run in this folder or below) where to go.
Ctrl-C drains the daemon and exits with a one-line summary.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from supervisor import cli, exitcodes
from supervisor.client.rest import Secret, SpooledAPI
from supervisor.commands import watch
from supervisor.commands.devlog import Renderer, import_error_text
from supervisor.commands.run import NOT_LINUX
from supervisor.config import parse_handler, parse_queues

FOLDER = ".spooled"
STATE = "dev.json"
DEFAULT_DB = f"{FOLDER}/dev.db"
SOLO_WORKER = "dev-solo"
STARTUP_GRACE = 30.0  # seconds a daemon asked to stop during its start-up has to get ready, then it is killed

EPILOG = f"""\
Other commands find a running `dev` on their own: `enqueue` and `status` with no --api-url / --port (and no
SPOOLED_API_URL / SPOOLED_HEALTH_PORT) read {FOLDER}/{STATE} in the current folder or the nearest one above,
which `dev` writes while it runs (the URL, the key, the queue and the daemon's health port).

Debugging: `--solo` runs no daemon: this process claims one job at a time and runs the handler itself, in the
foreground with the terminal attached, so breakpoint() or pdb stops in it (its lease is an hour long).
"""


def build_parser() -> argparse.ArgumentParser:
    p = cli.parser("dev", description="Run your handler against a local Spooled dev server with a web UI.",
                   epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--handler", required=True, metavar="MOD:FN", help="the job handler, e.g. app:handle, "
                   "imported from the current folder")
    p.add_argument("--queue", metavar="Q[,Q...]", help="queue(s) to run; default: the queue_name of the handler's "
                   "SDK worker")
    p.add_argument("--db", default=DEFAULT_DB, help=f"SQLite database; default {DEFAULT_DB}; :memory: keeps nothing")
    p.add_argument("--fresh", action="store_true", help="delete the database first (a new key too)")
    p.add_argument("--host", default="127.0.0.1", help="address of the dev server and UI; default 127.0.0.1")
    p.add_argument("--port", type=int, default=8787, help="port of the dev server and UI; default 8787, 0 = any free")
    p.add_argument("--procs", type=int, default=2, help="child processes of the daemon; default 2")
    p.add_argument("--watch", action="store_true", help="reload the children when a Python file of the handler's "
                   "package changes (a save that does not import keeps the old code)")
    p.add_argument("--watch-path", action="append", default=[], metavar="PATH", help="with --watch, also watch "
                   "this folder or file (repeatable)")
    p.add_argument("--solo", action="store_true", help="no daemon: run the handler in this process, one job at a "
                   "time, with the terminal attached (for breakpoint() / pdb)")
    return p


class Refused(Exception):
    """A one-line reason to exit 2."""


def prepare_folder(cwd: Path) -> Path:
    """.spooled/ made (with a .gitignore that ignores everything in it) and proven writable."""
    folder = cwd / FOLDER
    try:
        folder.mkdir(exist_ok=True)
        ignore = folder / ".gitignore"
        if not ignore.exists():
            ignore.write_text("# written by spooled-supervisor dev: the database holds payloads and the API key\n*\n")
        probe = folder / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise Refused(f"cannot write {folder}/: {exc.strerror or exc}") from None
    return folder


def remove_db(db: str) -> None:
    for suffix in ("", "-wal", "-shm"):
        try:
            os.unlink(db + suffix)
        except FileNotFoundError:
            pass


def write_state(path: Path, state: dict) -> None:
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(state, f)
    os.replace(tmp, path)


def _own_file(path: Path) -> bool:
    """Whether `path` belongs to this user and no one else may write it."""
    try:
        info = path.stat()
    except OSError:
        return False
    return info.st_uid == os.getuid() and not info.st_mode & 0o022


def find_running(start: str | None = None) -> dict | None:
    """The state of a `dev` running in `start` (default: the current folder) or the nearest folder above it,
    or None. A state file whose process is gone is ignored."""
    here = Path(start or os.getcwd()).resolve()
    for folder in (here, *here.parents):
        path = folder / FOLDER / STATE
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not _own_file(path):
            continue  # another user's (or a writable-by-all) state could send this user's jobs anywhere
        pid = state.get("pid") if isinstance(state, dict) else None
        try:
            os.kill(int(pid), 0)  # type: ignore[arg-type]
        except (TypeError, ValueError, ProcessLookupError):
            continue
        except PermissionError:
            pass
        return state
    return None


def child_env(cwd: Path) -> dict[str, str]:
    """The daemon's and the probe's environment: no SPOOLED_* of the user's (a real key stays out), the
    current folder first on the import path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOOLED_") and k != "CREDENTIALS_DIRECTORY"}
    env["PYTHONPATH"] = os.pathsep.join([str(cwd), *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                                     if p)])
    return env


def banner(url: str, key: str, queue: str, db: str, solo: bool) -> str:
    return (f"Spooled dev server at {url} (database {db})\n"
            f"  UI, signed in:  {url}/#key={key}\n"
            f"  queue:          {queue}" + (" (solo: jobs run in this process)" if solo else "") + "\n"
            f"  for your shell:\n"
            f"    export SPOOLED_API_URL={url}\n"
            f"    export SPOOLED_API_KEY={key}\n"
            f"Ctrl-C drains and stops.")


def main(argv: list[str]) -> int:
    if not sys.platform.startswith("linux"):
        sys.stderr.write(f"error: {NOT_LINUX}\n")
        return exitcodes.CONFIG
    args = build_parser().parse_args(argv)
    try:
        return Dev(args).run()
    except Refused as exc:
        sys.stderr.write(f"error: {exc}\n")
        return exitcodes.CONFIG


class Dev:
    """One `dev` session: the server in this process, the daemon (or the solo loop), the terminal."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.cwd = Path.cwd()
        self.stop = threading.Event()
        self.stops = 0
        self.renderer = Renderer()
        self.daemon: subprocess.Popen | None = None
        self.state_path = self.cwd / FOLDER / STATE
        self.state: dict = {}
        self.state_lock = threading.Lock()  # the daemon's output is read on a thread of its own
        self.started = time.monotonic()

    def on_signal(self, signum: int, frame: object) -> None:
        """Ctrl-C or SIGTERM: only noted here; `supervise` passes it on to the daemon."""
        self.stops += 1
        self.stop.set()

    def check_args(self) -> None:
        a = self.args
        try:
            parse_handler(a.handler)
            if a.queue:
                parse_queues(a.queue)
        except ValueError as exc:
            raise Refused(f"--handler/--queue: {exc}") from None
        if not 1 <= a.procs <= 1000:
            raise Refused("--procs must be 1-1000")
        if not 0 <= a.port <= 65535:
            raise Refused(f"--port must be 0-65535 (0: any free port), got {a.port}")
        if a.solo and a.watch:
            raise Refused("--solo runs the handler in this process and cannot reload it: drop --watch")
        for p in a.watch_path:
            if not os.path.exists(p):
                raise Refused(f"--watch-path {p!r} does not exist")

    def open_store(self):  # -> (Store, key)
        from supervisor.devserver.store import Store

        db = self.args.db
        if db != ":memory:" and self.args.fresh:
            remove_db(db)
        try:
            store = Store(db)
            key = store.bootstrap(None)
        except Exception as exc:  # a newer schema, not a database, unreadable
            raise Refused(f"cannot use the database {db}: {exc}") from None
        return store, key

    def run(self) -> int:
        self.check_args()
        folder = prepare_folder(self.cwd)
        signal.signal(signal.SIGINT, self.on_signal)
        signal.signal(signal.SIGTERM, self.on_signal)
        store, key = self.open_store()
        from supervisor.devserver.app import App, ServerConfig, make_server, serve_in_thread
        from supervisor.devserver.faults import Faults
        from supervisor.devserver.sweeps import Sweeper

        app = App(store, ServerConfig(), Faults())

        def full_error(job_id: str) -> str | None:
            rows = store.read("SELECT last_error FROM jobs WHERE id=?", (job_id,))
            return rows[0][0] if rows else None

        self.renderer.full_error = full_error
        try:
            server = make_server(app, self.args.host, self.args.port)
        except OSError as exc:
            store.close()
            raise Refused(f"cannot listen on {self.args.host}:{self.args.port}: {exc.strerror or exc} "
                          "(pass --port 0 for any free port)") from None
        host, port = server.server_address[:2]
        shown = f"[{host}]" if ":" in host else host
        url = f"http://{shown}:{port}"
        sweeper = Sweeper(store, 1.0, 3600.0 if self.args.solo else 120.0).start()
        serve_in_thread(server)
        self.state_path = state_path = folder / STATE
        try:
            return self.session(url, key)
        finally:
            try:
                state_path.unlink()
            except FileNotFoundError:
                pass
            server.shutdown()
            server.server_close()
            sweeper.stop()
            store.close()

    def session(self, url: str, key: str) -> int:
        env = child_env(self.cwd)
        handler = self.args.handler
        roots = watch.handler_roots(handler, str(self.cwd), self.args.watch_path)
        while True:
            error, about = watch.probe_about(handler, env, str(self.cwd))
            if error is None:
                break
            print(import_error_text(handler, error), file=sys.stderr, flush=True)
            if not self.args.watch:
                return exitcodes.HANDLER_IMPORT
            print("waiting for a save that fixes it (--watch)...", file=sys.stderr, flush=True)
            if not watch.wait_until_importable(handler, roots, env, str(self.cwd), self.stop):
                return 0
        queue = self.args.queue or about.get("queue_name")
        if not queue:
            raise Refused(f"--queue is required: {handler} is not a SpooledWorker's handler, so it names no queue")
        self.note_state(url=url, api_key=key, queue=queue.split(",")[0], pid=os.getpid(), health_url=None)
        print(banner(url, key, queue, self.args.db, self.args.solo), flush=True)
        if self.args.solo:
            code = self.solo(url, key, queue.split(",")[0])
        else:
            code = self.supervise(url, key, queue, env)
        took = time.monotonic() - self.started
        print(f"dev: stopped after {took:.0f} s: {self.renderer.completed} job(s) completed, "
              f"{self.renderer.failed} failed" + (f"; daemon exit code {code}" if code else ""), flush=True)
        return code

    def note_state(self, **changes: object) -> None:
        """Write `changes` into the state file (dev.json) with what it held."""
        with self.state_lock:
            self.state.update(changes)
            write_state(self.state_path, self.state)

    def supervise(self, url: str, key: str, queue: str, env: dict[str, str]) -> int:
        """Run the daemon (its health port one the kernel picks: the state file names it once the daemon says
        which) until it exits; its exit code."""
        a = self.args
        cmd = [sys.executable, "-m", "supervisor", "run", "--handler", a.handler, "--queue", queue, "--api-url", url,
               "--procs", str(a.procs), "--health-port", "0", "--log-format", "json", "--log-level",
               "DEBUG", "--poll-interval", "1", "--drain-timeout", "10",
               # no job is claimed ahead and held for a busy child: a job enqueued after a save runs on a child
               # that has the new code whenever one is idle
               "--prefetch", "0"]
        if a.watch:
            cmd.append("--watch")
            if a.watch_path:
                cmd += ["--watch-path", ",".join(os.path.abspath(p) for p in a.watch_path)]
        env = dict(env, SPOOLED_API_KEY=key)
        # its own session: Ctrl-C reaches this process only, which asks the daemon to drain
        self.daemon = subprocess.Popen(cmd, env=env, cwd=self.cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True)
        reader = threading.Thread(target=self.show, args=(self.daemon.stdout,), name="daemon-output", daemon=True)
        reader.start()
        self.note_state(daemon_pid=self.daemon.pid)
        try:
            code = self.wait_daemon(self.daemon)
        finally:
            reader.join(5.0)
            try:  # what it left in its group (a forkserver it had no time to stop) would hold its output open
                os.killpg(self.daemon.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        return code

    def wait_daemon(self, daemon: subprocess.Popen) -> int:
        """Until the daemon exits: each stop asked of `dev` becomes a SIGTERM to it (the first drains, a second
        stops at once, as `run` takes them), sent once it is ready (a signal during its start-up is not
        acted on); a daemon that never gets ready is killed STARTUP_GRACE seconds after the first."""
        sent = 0
        asked_at = None
        while True:
            try:
                return daemon.wait(0.1)
            except subprocess.TimeoutExpired:
                pass
            if self.stops > sent and (self.renderer.ready or self.stops > 1):
                sent = self.stops
                daemon.send_signal(signal.SIGTERM)
            if self.stop.is_set():
                asked_at = asked_at or time.monotonic()
                if not self.renderer.ready and time.monotonic() - asked_at > STARTUP_GRACE:
                    daemon.kill()

    def show(self, stream) -> None:
        for text in stream:
            port = self.renderer.health_port
            shown = self.renderer.line(text)
            if self.renderer.health_port != port:
                self.note_state(health_url=f"http://127.0.0.1:{self.renderer.health_port}")
            if shown is not None:
                print(shown, flush=True)

    def solo(self, url: str, key: str, queue: str) -> int:
        """Claim and run one job at a time in this process (breakpoint() works); stop on Ctrl-C."""
        from supervisor import exactjson
        from supervisor.child import wire
        from supervisor.child.handler import load_handler
        from supervisor.child.main import run_job
        from supervisor.job import Job

        sys.path.insert(0, str(self.cwd))
        handler = load_handler(self.args.handler)
        client = SpooledAPI(url, Secret(key), attempts=3)
        try:
            client.execute(client.register_call(queue, SOLO_WORKER, socket.gethostname(), 1, {"mode": "solo"}))
            while not self.stop.is_set():
                jobs = client.claim(queue, SOLO_WORKER, 1, 3600)
                if not jobs:
                    self.stop.wait(0.5)
                    continue
                job = Job.parse(jobs[0])
                if job is None:  # no id or lease id: nothing could report it
                    continue
                print(self.renderer.event({"msg": "job started", "job_id": job.id, "queue": queue,
                                           "pid": os.getpid()}), flush=True)
                began = time.monotonic()
                done = run_job(handler, job, SOLO_WORKER, 1_900_000)
                took = time.monotonic() - began
                if done.ok:
                    result = done.result  # the handler's JSON, encoded once in run_job (exactly, when wide)
                    if isinstance(result, wire.WideJSON):
                        result = exactjson.loads(result.text)
                    client.execute(client.complete_call(job.id, SOLO_WORKER, job.lease_id, result))
                    print(self.renderer.event({"msg": "job completed", "job_id": job.id, "duration": took}),
                          flush=True)
                else:
                    error = done.error or "Job failed"
                    client.execute(client.fail_call(job.id, SOLO_WORKER, job.lease_id, error))
                    print(self.renderer.event({"msg": "job failed", "job_id": job.id, "duration": took,
                                               "error": error}), flush=True)
            client.deregister(SOLO_WORKER)
        finally:
            client.close()
        return 0
