"""`ringfence demo showcase`: the sandbox on its own, before the reference demo in `make demo`.

A few ordinary calls and a few attacks, each run in a fresh hardened container of the pinned
tool image, each with its classified outcome. Nothing here is mocked.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ringfence_server.sandbox import labels as L
from ringfence_server.sandbox import listing
from ringfence_server.sandbox.backend import SandboxRequest
from ringfence_server.sandbox.docker_backend import DockerBackend
from ringfence_server.sandbox.errors import SandboxError
from ringfence_server.sandbox.profile import MiB, SandboxProfile
from ringfence_server.sandbox.result import Outcome

if TYPE_CHECKING:
    import docker

RUN_ID = "demo"  # the run label of every scene's container


@dataclass(frozen=True)
class Scene:
    title: str
    argv: tuple[str, ...]
    expect: tuple[Outcome, ...]
    profile: SandboxProfile = field(default_factory=SandboxProfile)
    stdin: bytes = b""


SCENES = (
    Scene("who am I (never root)", ("id", "-u"), (Outcome.OK,)),
    Scene("a stdlib Python computation", ("python3", "-c", "print(sum(range(10**6)))"), (Outcome.OK,)),
    Scene(
        "the tool runner: echo",
        (),
        (Outcome.OK,),
        stdin=b'{"tool": "echo", "arguments": {"text": "hello from a tool"}, "call_id": "demo-1"}',
    ),
    Scene("write to the root filesystem", ("sh", "-c", "echo pwned > /etc/passwd"), (Outcome.TOOL_ERROR,)),
    Scene("output flood: yes", ("sh", "-c", "yes"), (Outcome.OUTPUT_LIMIT,)),
    Scene(
        "memory bomb: 1 GiB with a 64 MiB limit",
        ("python3", "-c", "x = bytearray(1 << 30); print(len(x))"),
        (Outcome.OOM,),
        SandboxProfile(memory_bytes=64 * MiB),
    ),
    Scene(
        "fork bomb with 32 pids",
        ("sh", "-c", "f() { f | f & }; f; sleep 4"),
        # The shell itself may fail to fork once the pids are gone (tool_error), or the bomb
        # runs until the wall limit (timeout): either way it ends classified.
        (Outcome.TOOL_ERROR, Outcome.TIMEOUT),
        SandboxProfile(pids=32, timeout_s=3),
    ),
    Scene(
        "setsid escape from the deadline",
        ("sh", "-c", "setsid sleep 1000 & sleep 100"),
        (Outcome.TIMEOUT,),
        SandboxProfile(timeout_s=2),
    ),
)


def main() -> int:
    try:
        backend = DockerBackend()
    except SandboxError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print("ringfence sandbox showcase: each line is one fresh, hardened, single-use container\n")
    failures = 0
    try:
        for i, scene in enumerate(SCENES, 1):
            print(f"[{i}/{len(SCENES)}] {scene.title}", flush=True)
            started = time.monotonic()
            result = backend.run(
                SandboxRequest(profile=scene.profile, argv=scene.argv, stdin=scene.stdin, run_id=RUN_ID)
            )
            took = time.monotonic() - started
            expected = result.outcome in scene.expect
            failures += not expected
            mark = "as expected" if expected else "UNEXPECTED, wanted " + "/".join(o.value for o in scene.expect)
            output = result.stderr if result.outcome is Outcome.TOOL_ERROR else result.stdout
            detail = result.message if result.outcome is Outcome.OUTPUT_LIMIT else ""
            if result.stdout_truncated:
                detail += f" ({len(result.stdout)} bytes kept)"
            detail = detail or " ".join(output.decode(errors="replace").split())[:70] or result.message
            print(f"      -> {result.outcome.value:<12} exit={result.exit_code} in {took:.2f}s, {mark}")
            if detail:
                print(f"         {detail}")
        left = left_behind(backend.client)
        print(f"\n{len(SCENES) - failures} of {len(SCENES)} as expected; containers left behind: {len(left)}")
    finally:
        backend.close()
    return 1 if failures else 0


def left_behind(client: docker.DockerClient) -> list[str]:
    """The names of the showcase's containers still on the engine (none, when all went well).
    The engine is shared: what other processes remove meanwhile is not counted, nor a failure."""
    found = listing.containers(client, {"label": [f"{L.PRODUCT_LABEL}={L.PRODUCT}", f"{L.RUN_LABEL}={RUN_ID}"]})
    return [c.name or c.short_id for c in found]
