"""Talks to the dev server from inside a systemd test box (the box has loopback only), printing JSON.

    python systemd_box_api.py wait                      # until the API answers (30 s at most)
    python systemd_box_api.py enqueue QUEUE PAYLOAD N   # N jobs; prints their ids
    python systemd_box_api.py statuses ID...            # {id: status}
    python systemd_box_api.py workers                   # {worker id: status}

The URL and key come from SPOOLED_API_URL and SPOOLED_API_KEY.
"""

from __future__ import annotations

import json
import os
import sys
import time

import requests


def main(argv: list[str]) -> int:
    url, key = os.environ["SPOOLED_API_URL"], os.environ["SPOOLED_API_KEY"]
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {key}"
    command, args = argv[0], argv[1:]
    if command == "wait":
        deadline = time.monotonic() + 30
        while True:
            try:
                if session.get(f"{url}/health", timeout=2).ok:
                    return 0
            except requests.RequestException:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.05)
    if command == "enqueue":
        queue, payload, count = args[0], json.loads(args[1]), int(args[2])
        ids = []
        for _ in range(count):
            answer = session.post(f"{url}/api/v1/jobs", json={"queue_name": queue, "payload": payload}, timeout=10)
            answer.raise_for_status()
            ids.append(answer.json()["id"])
        print(json.dumps(ids))
    elif command == "statuses":
        print(json.dumps({job_id: session.get(f"{url}/api/v1/jobs/{job_id}", timeout=10).json()["status"]
                          for job_id in args}))
    elif command == "workers":
        answer = session.get(f"{url}/api/v1/workers", timeout=10)
        answer.raise_for_status()
        print(json.dumps({row["id"]: row["status"] for row in answer.json()}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
