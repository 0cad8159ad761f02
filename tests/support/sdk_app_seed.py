"""The SDK docs' worker module as published: it calls `worker.start()` at import, not under
`if __name__ == "__main__"`. Under the daemon that call must return at once and run no SDK worker.
"""

import os

from spooled import SpooledClient
from spooled.worker import SpooledWorker


def process_job(payload):
    return sum(payload.get("numbers", []))


client = SpooledClient(api_key=os.environ["SPOOLED_API_KEY"], base_url=os.environ.get("SPOOLED_API_URL"))
worker = SpooledWorker(client, queue_name=os.environ.get("SDK_APP_QUEUE", "my-queue"), concurrency=10)


@worker.process
def handle_job(ctx):
    total = process_job(ctx.payload)
    return {"success": True, "total": total}


worker.start()
