"""Process exit codes of `python -m supervisor run`; systemd's RestartPreventExitStatus uses them."""

OK = 0  # drained (or stopped at once on a second signal) and deregistered
FAILURE = 1  # unexpected error, or children that never came up
CONFIG = 2  # bad flag, missing key, bad value: fix the configuration
HANDLER_IMPORT = 3  # the handler module:function could not be imported
AUTH = 4  # the API answered 401: the key is wrong, revoked or expired
WORKER_ID_CONFLICT = 5  # the worker id belongs to another organisation (409 at register)
WORKER_ID_IN_USE = 6  # another live daemon heartbeats on this worker id (seen before registering, or it took over)

NAMES = {
    OK: "ok",
    FAILURE: "failure",
    CONFIG: "configuration error",
    HANDLER_IMPORT: "handler import error",
    AUTH: "unauthorized",
    WORKER_ID_CONFLICT: "worker id owned by another organization",
    WORKER_ID_IN_USE: "worker id in use by another live daemon",
}
