"""The SDK's async worker module: an AsyncSpooledClient, an AsyncSpooledWorker and a coroutine handler that
awaits `ctx.log` and `ctx.progress`, as the SDK's docs write one. Run by the daemon with
`--handler tests.support.sdk_app_async:worker`.
"""

import asyncio
import os

from spooled import AsyncSpooledClient, AsyncSpooledWorker

client = AsyncSpooledClient(api_key=os.environ["SPOOLED_API_KEY"], base_url=os.environ.get("SPOOLED_API_URL"))
worker = AsyncSpooledWorker(client, queue_name=os.environ.get("SDK_APP_QUEUE", "sdk-app-async"))


@worker.process
async def handle_job(ctx):
    await ctx.log("debug", "starting", {"n": ctx.payload.get("n")})
    await asyncio.sleep(0)
    await ctx.progress(-5)
    await ctx.log("warn", "halfway", {"n": ctx.payload.get("n")})
    return {"doubled": ctx.payload.get("n", 0) * 2, "signal": type(ctx.signal).__name__,
            "stopped": ctx.signal.is_set()}


if __name__ == "__main__":
    asyncio.run(worker.start())
