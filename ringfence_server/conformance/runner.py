"""Run the conformance cases against one pinned image on one runtime, and report.

Each probe a selected case reads runs once, in a fresh sandbox made by the same DockerBackend
the control plane dispatches through (cold: no warm pool), with the image the user's lock pins
and the runtime asked for. The probes run a few at a time; the ones marked `alone` (the fork
bomb, the CPU burn) after the rest, one by one, so that they slow no other call whose wall
clock runs. The image cases are ringfence_server.imagebuild.adopt's checks on the image's exported
filesystem, meanwhile. Then every case's check reads what its probes got.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ringfence_server.conformance.cases import (
    CASES,
    NOT_INCLUDED,
    RUN_ID,
    TITLES,
    Call,
    Case,
    Evidence,
    Expect,
    Host,
    ImageCheck,
    Probe,
    ProbeBroken,
    make_probes,
    needed_probes,
)
from ringfence_server.sandbox import labels as L
from ringfence_server.sandbox.backend import SandboxRequest
from ringfence_server.sandbox.errors import ProfileError, SandboxError
from ringfence_server.sandbox.profile import RUNTIMES, SandboxProfile

if TYPE_CHECKING:
    from docker import DockerClient

    from ringfence_server.sandbox.docker_backend import DockerBackend
    from ringfence_server.sandbox.pinned_images import Lock

PASS, FAIL, XFAIL = "PASS", "FAIL", "XFAIL"
DEFAULT_JOBS = 3
# What a check compares with on the host, when this process runs beside the engine.
HOST_FILES = ("/proc/cmdline", "/proc/modules", "/proc/partitions", "/proc/diskstats",
              "/sys/devices/virtual/dmi/id/product_name", "/sys/class/dmi/id/product_name")
NAMESPACES = ("pid", "ipc", "uts", "net", "mnt")


@dataclass(frozen=True)
class CaseResult:
    case: Case
    status: str  # PASS | FAIL | XFAIL (a documented finding of the runtime)
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        c = self.case
        return {"case": c.case, "number": c.number, "kind": "image" if c.image else "sandbox", "title": c.title,
                "status": self.status, "detail": self.detail, "partial": c.partial}


@dataclass(frozen=True)
class Report:
    image: str
    image_id: str
    runtime: str
    engine: str
    results: tuple[CaseResult, ...]
    duration_s: float
    not_selected: tuple[str, ...] = ()
    not_included: Mapping[int, str] = field(default_factory=lambda: dict(NOT_INCLUDED))

    @property
    def failed(self) -> list[str]:
        return [r.case.case for r in self.results if r.status == FAIL]

    @property
    def ok(self) -> bool:
        return not self.failed

    def count(self, status: str) -> int:
        return sum(1 for r in self.results if r.status == status)

    def summary(self) -> str:
        parts = [f"{self.count(PASS)} passed"]
        if self.failed:
            parts.append(f"{len(self.failed)} failed ({', '.join(self.failed)})")
        xfailed = [r.case.case for r in self.results if r.status == XFAIL]
        if xfailed:
            parts.append(f"{len(xfailed)} known {self.runtime} finding{'s' if len(xfailed) > 1 else ''} "
                         f"({', '.join(xfailed)})")
        parts.append(f"{len(self.not_included)} not in conformance")
        if self.not_selected:
            parts.append(f"{len(self.not_selected)} not selected")
        verdict = "FAILED" if self.failed else "OK"
        return f"{verdict}: " + ", ".join(parts) + f" in {self.duration_s:.1f} s"

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "image": self.image,
            "image_id": self.image_id,
            "runtime": self.runtime,
            "engine": self.engine,
            "cases": [r.to_json() for r in self.results],
            "failed": self.failed,
            "not_included": [{"number": n, "title": TITLES[n], "needs": needs}
                             for n, needs in sorted(self.not_included.items())],
            "not_selected": list(self.not_selected),
            "summary": {"passed": self.count(PASS), "failed": self.count(FAIL), "xfailed": self.count(XFAIL),
                        "not_included": len(self.not_included), "not_selected": len(self.not_selected)},
            "duration_s": round(self.duration_s, 2),
        }

    def table(self) -> str:
        width = max([len("case")] + [len(r.case.case) for r in self.results])
        lines = [f"ringfence conformance: image {self.image} ({self.image_id[:19]}), runtime {self.runtime}, "
                 f"Docker {self.engine}", "", f"{'case':<{width}}  result  title"]
        for r in self.results:
            lines.append(f"{r.case.case:<{width}}  {r.status:<6}  {r.case.title}")
            if r.detail and r.status != PASS:
                lines.append(f"{'':<{width}}          {r.detail}")
        lines.append("")
        lines.append("not in conformance (needs the test battery's harness): "
                     + ", ".join(str(n) for n in sorted(self.not_included)))
        if self.not_selected:
            lines.append("not selected (--case): " + ", ".join(self.not_selected))
        lines.append(self.summary())
        return "\n".join(lines)


def select(ids: Iterable[str] | None) -> list[Case]:
    """The cases named by `ids` ("13", "4.image"; a bare number takes its image case too), or
    all. ProfileError names an id that is no case here."""
    if ids is None:
        return list(CASES)
    wanted = set(ids)
    known = {c.case for c in CASES} | {str(c.number) for c in CASES}
    unknown = sorted(wanted - known, key=lambda s: (len(s), s))
    if unknown:
        raise ProfileError("case", f"no such conformance case: {', '.join(unknown)} "
                                   f"(cases: {', '.join(c.case for c in CASES)})")
    return [c for c in CASES if c.case in wanted or str(c.number) in wanted]


def evaluate(case: Case, ev: Evidence) -> CaseResult:
    problems = _problems(case.check, ev)
    if problems:
        return CaseResult(case, FAIL, _join(problems))
    if case.finding is None:
        return CaseResult(case, PASS)
    found = _problems(case.finding.check, ev)
    reason = case.finding.runtimes.get(ev.runtime)
    if found:
        return CaseResult(case, XFAIL, f"{reason}: {_join(found)}") if reason else CaseResult(case, FAIL, _join(found))
    if reason:
        return CaseResult(case, PASS, f"the documented gap did not show ({reason})")
    return CaseResult(case, PASS)


def _problems(check: Callable[[Evidence, Expect], None], ev: Evidence) -> list[str]:
    x = Expect()
    try:
        check(ev, x)
    except ProbeBroken as e:
        x.problems.append(str(e))
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
        # A probe that printed something other than its report (an image lacking what it uses).
        x.problems.append(f"the probe's report is not what the case reads ({type(e).__name__}: {e})")
    return x.problems


def _join(problems: list[str], most: int = 4) -> str:
    shown = "; ".join(problems[:most])
    return shown + (f"; and {len(problems) - most} more" if len(problems) > most else "")


def host_context(client: DockerClient, image_id: str) -> Host:
    config = client.images.get(image_id).attrs.get("Config") or {}
    env = dict(item.split("=", 1) for item in config.get("Env") or [] if "=" in item)
    namespaces = {}
    for kind in NAMESPACES:
        with contextlib.suppress(OSError):
            namespaces[kind] = os.readlink(f"/proc/self/ns/{kind}")
    files = {}
    for path in HOST_FILES:
        try:
            with open(path, "rb") as f:
                files[path] = f.read(1 << 16).decode("latin-1")
        except OSError:
            pass
    return Host(env, namespaces, files)


def _inspect_image(client: DockerClient, image_id: str) -> dict[str, ImageCheck]:
    from ringfence_server.imagebuild import adopt

    inspection = adopt.inspect(client, image_id, tool=False)
    return {c.name: ImageCheck(c.name, c.ok, c.detail) for c in inspection.checks}


class _StatsWatch(threading.Thread):
    """Reads the engine's stats of one call's container (`docker stats`, one sample) `after_s`
    seconds after it is seen running: what the engine's cgroup counters say while the call runs."""

    def __init__(self, client: DockerClient, call_id: str, after_s: float) -> None:
        super().__init__(daemon=True, name=f"stats-{call_id}")
        self.client, self.call_id, self.after_s = client, call_id, after_s
        self.stats: dict[str, Any] | None = None
        self.error = "the call's container was never seen running"
        self.done = threading.Event()

    def run(self) -> None:
        selector = {"label": f"{L.CALL_LABEL}={self.call_id}"}
        try:
            while not self.done.is_set():
                # The low-level list: one request, no inspect racing the container's removal.
                found = self.client.api.containers(filters=selector)
                if found and found[0].get("State") == "running":
                    time.sleep(self.after_s)
                    raw = self.client.api.stats(found[0]["Id"], stream=False)
                    self.stats = dict(raw.get("cpu_stats") or {})
                    return
                time.sleep(0.05)
        except Exception as e:  # noqa: BLE001 - any engine failure: the case says it could not read them
            self.error = f"{type(e).__name__}: {e}"


def _call(backend: DockerBackend, client: DockerClient, probe: Probe, image: str, runtime: str) -> Call:
    call_id = f"{probe.key}.{uuid.uuid4().hex[:8]}"
    watch = _StatsWatch(client, call_id, probe.stats_after_s) if probe.stats_after_s is not None else None
    if watch is not None:
        watch.start()
    try:
        profile = SandboxProfile(image=image, runtime=runtime, **probe.limits)
        result = backend.run(SandboxRequest(profile=profile, argv=probe.argv, run_id=RUN_ID, call_id=call_id,
                                            warm=False))
    except SandboxError as e:
        return Call(probe, None, f"{type(e).__name__}: {e}")
    finally:
        if watch is not None:
            watch.done.set()
            watch.join(30)
    try:
        left = client.api.containers(all=True, filters={"label": f"{L.CALL_LABEL}={call_id}"})
        leftovers = tuple(sorted(str((c.get("Names") or [c.get("Id")])[0]) for c in left))
    except Exception as e:  # noqa: BLE001 - any engine failure: the case cannot show nothing is left
        leftovers = (f"(could not list: {e})",)
    if watch is None:
        return Call(probe, result, None, leftovers)
    return Call(probe, result, None, leftovers, watch.stats, None if watch.stats is not None else watch.error)


def run_conformance(client: DockerClient, lock: Lock, *, image: str = "tool", runtime: str = "runc",
                    cases: Iterable[str] | None = None, jobs: int = DEFAULT_JOBS,
                    progress: Callable[[str], None] | None = None) -> Report:
    """Run the selected cases (default: all) against `image` (a name `lock` pins) on `runtime`.

    Raises SandboxError when the run cannot happen at all: the image is not pinned or not in
    the engine (ImageError), the engine fails or lacks Docker's seccomp profile (EngineError),
    an unknown runtime or case, or no runsc for gVisor (ProfileError). A case that fails is a
    result, not an exception."""
    from ringfence_server.sandbox.docker_backend import DockerBackend
    from ringfence_server.sandbox.pinned_images import resolve_pinned

    say = progress or (lambda _msg: None)
    started = time.monotonic()
    if runtime not in RUNTIMES:
        raise ProfileError("runtime", f"{runtime!r} is not one of {', '.join(RUNTIMES)}")
    if jobs < 1:
        raise ProfileError("jobs", "must be at least 1")
    selected = select(cases)
    image_id = resolve_pinned(client, image, lock)
    backend = DockerBackend(client, lock=lock)  # not closed: that would close the caller's client
    if runtime == "gvisor" and "runsc" not in backend.runtimes():
        raise ProfileError("runtime", "the engine has no runsc runtime (run `make gvisor`)")
    engine = str(client.version().get("Version", "?"))
    host = host_context(client, image_id)

    all_probes = make_probes()
    wanted = [all_probes[k] for k in needed_probes(selected)]
    calls: dict[str, Call] = {}
    mutex = threading.Lock()

    def run_one(probe: Probe) -> None:
        call = _call(backend, client, probe, image, runtime)
        with mutex:
            calls[probe.key] = call
        r = call.result
        say(f"{probe.key}: " + (r.outcome.value if r is not None else f"not run: {call.error}"))

    image_checks: dict[str, ImageCheck] = {}
    image_error: str | None = None
    with ThreadPoolExecutor(max_workers=jobs + 1, thread_name_prefix="conformance") as pool:
        inspecting = pool.submit(_inspect_image, client, image_id) if any(c.image for c in selected) else None
        say(f"{len(wanted)} probes in {runtime} sandboxes of {image} ({image_id[:19]}), {jobs} at a time")
        together = [p for p in wanted if not p.alone]
        # jobs workers for the probes (the pool has one more, for the image inspection).
        limiter = threading.Semaphore(jobs)

        def limited(probe: Probe) -> None:
            with limiter:
                run_one(probe)

        for future in [pool.submit(limited, p) for p in together]:
            future.result()
        for probe in (p for p in wanted if p.alone):
            run_one(probe)
        if inspecting is not None:
            try:
                image_checks = inspecting.result()
            except SandboxError as e:
                image_error = f"{type(e).__name__}: {e}"

    ev = Evidence(runtime, calls, host, image_checks, image_error)
    results = tuple(evaluate(c, ev) for c in selected)
    chosen = {c.case for c in selected}
    return Report(image=image, image_id=image_id, runtime=runtime, engine=engine, results=results,
                  duration_s=time.monotonic() - started,
                  not_selected=tuple(c.case for c in CASES if c.case not in chosen))


__all__ = ["DEFAULT_JOBS", "FAIL", "PASS", "XFAIL", "CaseResult", "Report", "evaluate", "host_context",
           "run_conformance", "select"]
