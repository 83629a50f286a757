"""The epicbox side of bench_speed's side-by-side: run in a venv of its own (`make bench` makes
.bench-epicbox-venv with epicbox from the package index), never importing ringfence.

    python bench/epicbox_child.py IMAGE_ID N  ->  one JSON line: {"samples_s": [...], "version": ...}

Each sample is one `epicbox.run` of the same runner, in the same pinned `tool` image (by ID: no
registry), with the same request body on stdin as bench_speed's other variants: epicbox creates,
starts, waits for and removes a container per run, as it does for its users. Its own defaults
(user, read-only root, no network, its limits) stand; what it does not set (seccomp beyond
Docker's, masked paths, tini) it does not pay for.
"""

from __future__ import annotations

import json
import sys
import time
from importlib.metadata import version

import epicbox

BODY = json.dumps({"tool": "echo", "arguments": {"text": "hi"}, "call_id": "b1", "idempotency_key": None},
                  separators=(",", ":")).encode()


def main() -> int:
    image_id, n = sys.argv[1], int(sys.argv[2])
    epicbox.configure(profiles=[epicbox.Profile("ringfence_tool", image_id, user="10001", read_only=True,
                                                network_disabled=True)])
    command = "python3 -I -S -B /opt/ringfence/runner.py"
    samples = []
    for i in range(n + 1):  # the first warms caches, as bench_speed's variants do
        started = time.perf_counter()
        result = epicbox.run("ringfence_tool", command, stdin=BODY, limits={"cputime": 10, "memory": 64})
        elapsed = time.perf_counter() - started
        if result.get("exit_code") != 0 or b'"ok":true' not in (result.get("stdout") or b""):
            print(json.dumps({"error": f"epicbox run failed: {result!r}"[:800]}), flush=True)
            return 1
        if i:
            samples.append(elapsed)
    print(json.dumps({"samples_s": samples, "version": version("epicbox")}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
