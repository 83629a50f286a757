"""`make demo`: a short showcase of the sandbox, until the reference agent demo exists.

A few ordinary calls and a few attacks, each run in a fresh hardened container of the pinned
tool image, each with its classified outcome. Nothing here is mocked.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

from sandbox.backend import SandboxRequest
from sandbox.docker_backend import DockerBackend
from sandbox.errors import SandboxError
from sandbox.profile import MiB, SandboxProfile
from sandbox.result import Outcome


@dataclass(frozen=True)
class Scene:
    title: str
    argv: tuple[str, ...]
    expect: Outcome
    profile: SandboxProfile = SandboxProfile()
    stdin: bytes = b""


SCENES = (
    Scene("who am I (never root)", ("id", "-u"), Outcome.OK),
    Scene("a stdlib Python computation", ("python3", "-c", "print(sum(range(10**6)))"), Outcome.OK),
    Scene(
        "the tool runner: echo",
        (),
        Outcome.OK,
        stdin=b'{"tool": "echo", "arguments": {"text": "hello from a tool"}, "call_id": "demo-1"}',
    ),
    Scene("write to the root filesystem", ("sh", "-c", "echo pwned > /etc/passwd"), Outcome.TOOL_ERROR),
    Scene("output flood: yes", ("sh", "-c", "yes"), Outcome.OUTPUT_LIMIT),
    Scene(
        "memory bomb: 1 GiB with a 64 MiB limit",
        ("python3", "-c", "x = bytearray(1 << 30); print(len(x))"),
        Outcome.OOM,
        SandboxProfile(memory_bytes=64 * MiB),
    ),
    Scene(
        "fork bomb with 32 pids",
        ("sh", "-c", "f() { f | f & }; f; sleep 4"),
        Outcome.TIMEOUT,
        SandboxProfile(pids=32, timeout_s=3),
    ),
    Scene(
        "setsid escape from the deadline",
        ("sh", "-c", "setsid sleep 1000 & sleep 100"),
        Outcome.TIMEOUT,
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
            print(f"[{i}/{len(SCENES)}] {scene.title} ...", end="", flush=True)
            started = time.monotonic()
            result = backend.run(
                SandboxRequest(profile=scene.profile, argv=scene.argv, stdin=scene.stdin, run_id="demo")
            )
            took = time.monotonic() - started
            mark = "as expected" if result.outcome is scene.expect else f"EXPECTED {scene.expect.value}"
            failures += result.outcome is not scene.expect
            detail = result.message or result.stdout.decode(errors="replace").strip()[:60]
            if result.stderr and not detail:
                detail = result.stderr.decode(errors="replace").strip()[:60]
            print(f"\r[{i}/{len(SCENES)}] {scene.title:<42} -> {result.outcome.value:<12} "
                  f"exit={result.exit_code} {took:5.2f}s  {mark}")
            if detail:
                print(f"        {detail}")
        left = backend.client.containers.list(all=True, filters={"label": "ringfence.run=demo"})
        print(f"\ncontainers of the demo still present: {len(left)}")
    finally:
        backend.close()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
