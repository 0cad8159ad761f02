"""A worker module written for the official SDK, the way its docs show one: the key read from the environment
at import, a SpooledClient, a SpooledWorker, `@worker.process`, and `worker.start()` when run as a script.
The daemon runs it unchanged with `--handler tests.support.sdk_app:handle_job` or
`--handler tests.support.sdk_app:worker`.

SPOOLED_API_URL points the client at the dev server in tests (the daemon hands it over with the key).
"""

import os

from spooled import SpooledClient
from spooled.worker import SpooledWorker

client = SpooledClient(api_key=os.environ["SPOOLED_API_KEY"], base_url=os.environ.get("SPOOLED_API_URL"))
worker = SpooledWorker(client, queue_name=os.environ.get("SDK_APP_QUEUE", "sdk-app"), concurrency=10,
                       lease_duration=45)


@worker.on("job:completed")
def on_completed(event):
    print(f"completed {event.job_id}")


@worker.process
def handle_job(ctx):
    ctx.log("info", "resizing", {"width": ctx.payload.get("width"), "attempt": ctx.retry_count})
    ctx.progress(150, "clamped to 100")
    ctx.log("notice", "an unknown level")
    ctx.log("keyword form", step=2)
    follow_up = ctx.payload.get("follow_up")
    created = None
    if follow_up:
        created = client.jobs.create({"queue_name": follow_up, "payload": {"parent": ctx.job_id}}).id
    return {"success": True, "width": ctx.payload.get("width"), "queue": ctx.queue_name,
            "signal": type(ctx.signal).__name__, "created": created}


if __name__ == "__main__":
    worker.start()
