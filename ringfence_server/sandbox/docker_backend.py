"""DockerBackend: one call, one fresh hardened container, one classified result.

The public entry of the sandbox runtime on a local Docker engine. It runs a call cold (create,
attach, start, pump, wait, classify, remove) or in a warm container from its pool, and wires
the pieces that each own one thing:

    sandbox.hardening, sandbox.host_config   the fixed hardening, as the engine's settings
    ringfence_server.sandbox.streams                          the attach socket, demultiplexing, capped output
    ringfence_server.sandbox.pool                             warm containers and how a call is handed to one
    sandbox.classify (sandbox.result)        how the container ended -> Outcome and message
    ringfence_server.sandbox.runner_protocol                  what the image's runner prints
    ringfence_server.sandbox.inflight                         the calls running now (kill_run, kill_all)
    ringfence_server.sandbox.removal                          warm containers removed after their call
    ringfence_server.sandbox.engine                           the engine's errors and shared operations

The hardening is fixed (ringfence_server.sandbox.hardening), not in the profile, so no caller can opt out of it:
non-root uid:gid, read-only root, every capability dropped, no-new-privileges, our seccomp
profile (Docker's default, tightened), private IPC, tini as PID 1 (inside the image), no network,
no host env, no host mounts but declared read-only inputs, a noexec size-capped /tmp, ulimits.
The wall time is enforced by killing the container (killing a client process would leave
`setsid` children alive). The container is removed whatever happens.

The methods named with one underscore that take or return settings, streams or containers
(`_container_settings`, `_apply_egress`, `_create`, `_pump`, `_tool_ended`, `_make_warm`,
`_run_warm`, `_workspace_missing`) are the seams the escape battery and the integration tests
subclass to remove exactly one protection or to break the engine at one point.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import docker
import docker.errors
from docker.models.containers import Container

from ringfence_server.sandbox import engine, listing, seccomp
from ringfence_server.sandbox import labels as L
from ringfence_server.sandbox.backend import SandboxRequest
from ringfence_server.sandbox.classify import engine_reported_oom, explain
from ringfence_server.sandbox.egress.channel import EgressError
from ringfence_server.sandbox.egress.proxy import CallEgress, EgressProxy, EgressReport, ProxySettings, egress_mount
from ringfence_server.sandbox.engine import ENGINE_ERRORS, container_id
from ringfence_server.sandbox.errors import EngineError, ImageError, ProfileError
from ringfence_server.sandbox.host_config import applied_settings, host_config_kwargs, workspace_source
from ringfence_server.sandbox.inflight import Inflight, Progress
from ringfence_server.sandbox.mcp_session import McpSessions, McpSettings
from ringfence_server.sandbox.pinned_images import Lock, load_lock, resolve_pinned
from ringfence_server.sandbox.pool import (
    LAUNCHER_ARGV,
    POOL_DEADLINE_MARGIN_S,
    Demux,
    Load,
    PoolSettings,
    ShapeKey,
    ShapeSpec,
    Warm,
    WarmPool,
    claimed_name,
    claimed_prefix,
    launch_line,
    warm_alive,
)
from ringfence_server.sandbox.profile import SandboxProfile, WorkspaceMount
from ringfence_server.sandbox.reaper import PeriodicReaper
from ringfence_server.sandbox.removal import Remover
from ringfence_server.sandbox.result import Outcome, SandboxResult, classify_exit
from ringfence_server.sandbox.streams import CappedStreams, Demuxer, close_attach, open_attach, pump
from ringfence_server.sandbox.witness import InitWitness
from ringfence_server.sandbox.workspace import WORKSPACE_LABEL

# Receives each egress call's proxy decisions: (request, ringfence_server.sandbox.egress.proxy.EgressReport).
EgressReportHook = Callable[[SandboxRequest, EgressReport], None]


class DockerBackend:
    """Runs each request in a fresh container on the local engine."""

    def __init__(self, client: docker.DockerClient | None = None, *, lock: Lock | None = None,
                 egress_proxy: EgressProxy | None = None, on_egress_report: EgressReportHook | None = None,
                 egress_settings: ProxySettings | None = None, pool: PoolSettings | None = None,
                 mcp: McpSettings | None = None) -> None:
        try:
            # max_pool_size: every concurrent call talks to the engine; past docker-py's default
            # of 10 connections per URL, urllib3 drops connections, and docker-py's per-URL pool
            # cache can close a pool another thread is using (seen at 20 concurrent calls).
            self._client = client or docker.from_env(timeout=60, max_pool_size=64)
            self._client.ping()
        except docker.errors.DockerException as e:
            raise EngineError(f"cannot reach the Docker engine: {e}") from e
        # Every container is made with our seccomp profile, derived from Docker's default: without
        # that file nothing can run, so say so now, not as each call's transient failure.
        seccomp.profile_json("runc")
        self._lock = lock
        self._runtimes: set[str] | None = None
        # The calls running now, by run (for kill_run and kill_all).
        self._inflight = Inflight()
        self._reaper: PeriodicReaper | None = None
        self._image_cmds: dict[str, list[str]] = {}
        # name -> pinned image ID the engine was seen to hold: checked once, not per call (a
        # round trip on every call's path). An ID names its content, so it cannot change; if the
        # image is removed, a cold create says so (ImageError) and the check runs again.
        self._verified_images: dict[str, str] = {}
        # Calls running now, and of them cold starts: the pool's refill gives way to them
        # (ringfence_server.sandbox.pool.Load).
        self._calls = 0
        self._cold = 0
        self._load_mutex = threading.Lock()
        # The egress proxy (ringfence_server.sandbox.egress.proxy.EgressProxy) for
        # calls whose profile has an egress grant; created on first use unless one is given.
        # `on_egress_report(request, EgressReport)` receives each call's proxy decisions.
        self._egress_proxy = egress_proxy
        self._owns_egress_proxy = egress_proxy is None
        # ProxySettings for the proxy this backend starts itself (e.g. the operator's services).
        self._egress_settings = egress_settings
        self._egress_mutex = threading.Lock()
        self._on_egress_report = on_egress_report
        # Warm containers (ringfence_server.sandbox.pool): None unless asked for, and never for size 0.
        self.pool: WarmPool[ShapeKey, ShapeSpec] | None = None
        self._shape_digests: dict[str, str] = {}
        # run id -> the pool shapes of its workspace calls (let go of at end_run).
        self._run_shapes: dict[str, set[ShapeKey]] = {}
        self._run_shapes_mutex = threading.Lock()
        # Warm containers are removed after their call off its critical path (drained on close).
        self._remover = Remover(self._remove)
        # MCP servers' session sandboxes (ringfence_server.sandbox.mcp_session), made on first use.
        self._mcp: McpSessions | None = None
        self._mcp_settings = mcp
        self._mcp_mutex = threading.Lock()
        if pool is not None and pool.size > 0:
            self.pool = WarmPool(pool, shape=self._pool_shape, make=self._make_warm, discard=self._discard_warm,
                                 alive=warm_alive, load=self._load)

    @property
    def client(self) -> docker.DockerClient:
        return self._client

    @property
    def egress_proxy(self) -> EgressProxy | None:
        """The egress proxy in use (started on the first egress call), or None."""
        return self._egress_proxy

    @property
    def mcp_sessions(self) -> McpSessions:
        """The session sandboxes of MCP servers (started on a run's first call to a server)."""
        with self._mcp_mutex:
            if self._mcp is None:
                self._mcp = McpSessions(self, self._mcp_settings)
            return self._mcp

    def close(self) -> None:
        if self._mcp is not None:
            self._mcp.close()  # before the proxy: a session's egress grant is the proxy's
        if self.pool is not None:
            self.pool.close()  # before the proxy: warm egress containers hold its directories
        self._remover.close(60)
        if self._reaper is not None:
            self._reaper.stop()
            self._reaper = None
        if self._owns_egress_proxy and self._egress_proxy is not None:
            self._egress_proxy.close()
            self._egress_proxy = None
        self._client.close()

    def _egress(self) -> EgressProxy:
        """The egress proxy, started on the first egress call (most runs never need one)."""
        with self._egress_mutex:
            if self._egress_proxy is None:
                self._egress_proxy = EgressProxy(self._client, lock=self._lock, settings=self._egress_settings)
            return self._egress_proxy

    def _apply_egress(self, settings: dict[str, Any], call: CallEgress) -> dict[str, Any]:
        """An egress call's sandbox keeps network_mode none (only lo): a Docker network of its
        own would bring the engine's embedded resolver (127.0.0.11, which answers container
        names and forwards the rest), a gateway, and a network to create per call. Its one way
        out is its own socket directory (ringfence_server.sandbox.egress.proxy.CallEgress), bind-mounted
        read-only; the relay (ringfence_server.sandbox.egress.relay, put in front of the command by `_run`) runs
        after the init and before the tool, and the environment names it as the HTTP proxy, with
        the call's credentials. Tests
        subclass this to remove one protection and show what it stops."""
        settings = dict(settings)
        settings["mounts"] = [*list(settings.get("mounts") or []), call.mount()]
        settings["environment"] = {**dict(settings.get("environment") or {}), **dict(call.env)}
        return settings

    def runtimes(self) -> set[str]:
        if self._runtimes is None:
            self._runtimes = set((self._client.info().get("Runtimes") or {}).keys())
        return self._runtimes

    def _image_id(self, name: str) -> str:
        verified = self._verified_images.get(name)
        if verified is not None:
            return verified
        if self._lock is None:
            # Read once, on first dispatch (not at construction: a backend may exist before
            # `make images`). A server keeps trusting the lock it started with.
            self._lock = load_lock()
        image_id = resolve_pinned(self._client, name, self._lock)
        self._verified_images[name] = image_id
        return image_id

    def run(self, request: SandboxRequest) -> SandboxResult:
        reports: list[EgressReport] = []
        try:
            if request.mcp is not None:
                return self.mcp_sessions.call(request)
            result = self._run(request, reports)
        except ENGINE_ERRORS as e:
            # Before any container existed (the image look-up, the runtime list): the engine's
            # failure, raised as the sandbox layer's own error so callers can classify it.
            raise EngineError(f"the Docker engine failed: {type(e).__name__}: {e}") from e
        if reports and reports[0].events:
            # The proxy's decisions arrive when the call's credentials are revoked, after the
            # container is gone: they become part of the call's result.
            result = dataclasses.replace(result, egress_events=tuple(reports[0].events))
        return result

    def _run(self, request: SandboxRequest, reports: list[EgressReport]) -> SandboxResult:
        profile = request.profile
        image_id = self._image_id(profile.image)
        if profile.runtime == "gvisor" and "runsc" not in self.runtimes():
            raise ProfileError("runtime", "the engine has no runsc runtime (run `make gvisor`)")
        # Counted from before the claim: the refill, woken by the claim, must already see it.
        with self._load_mutex:
            self._calls += 1
        try:
            if self.pool is not None and self._inflight.stopping is None:
                shaped = self._pool_shape(request, image_id)
                warm = self.pool.claim(request, shaped) if shaped is not None else None
                if warm is not None:
                    return self._run_warm(warm, request, reports)
            return self._run_cold(request, image_id, reports, self._cold_start_progress())
        finally:
            with self._load_mutex:
                self._calls -= 1
            if self.pool is not None:
                self.pool.nudge()  # the refill gave way while this call ran

    def _cold_start_progress(self) -> Progress:
        """A cold call's Progress, counted as a cold start (which the refill gives way to) until
        the engine answered its start, or the call ended without one."""
        with self._load_mutex:
            self._cold += 1
        starting = [True]

        def started() -> None:
            with self._load_mutex:
                if not starting[0]:
                    return
                starting[0] = False
                self._cold -= 1
            if self.pool is not None:
                self.pool.nudge()

        return Progress(on_started=started)

    def _run_cold(self, request: SandboxRequest, image_id: str, reports: list[EgressReport],
                  progress: Progress) -> SandboxResult:
        """The call in a container made for it: create, attach, start, pump, wait, classify, remove."""
        try:
            return self._cold_call(request, image_id, reports, progress)
        finally:
            progress.started()  # no longer a cold start, if it never got as far as the start

    def _cold_call(self, request: SandboxRequest, image_id: str, reports: list[EgressReport],
                   progress: Progress) -> SandboxResult:
        profile = request.profile
        name = f"rf-{request.run_id[:24]}-{request.call_id[:24]}-{uuid.uuid4().hex[:6]}".replace(":", "_")
        started = time.monotonic()
        container_labels = L.base_labels("call", deadline_s=profile.timeout_s + 60)
        container_labels.update({L.RUN_LABEL: request.run_id, L.CALL_LABEL: request.call_id})
        kwargs = self._container_settings(profile)
        container: Container | None = None
        egress_call: CallEgress | None = None  # the call's socket and credentials at the proxy, while it runs
        try:
            if profile.egress is not None:
                if profile.runtime != "runc":
                    # runsc is registered with --network=none and without --host-uds: a gVisor
                    # sandbox could not connect to the call's socket.
                    raise ProfileError("egress", "egress tools run on runc only")
                try:
                    egress_call = self._egress().open_call(request.call_id, profile.egress)
                except EgressError as e:
                    return self._start_failed(profile, image_id, started, f"egress: {e}")
                kwargs = self._apply_egress(kwargs, egress_call)
            if profile.workspace is not None:
                missing = self._workspace_missing(profile.workspace)
                if missing:
                    return self._start_failed(profile, image_id, started, missing)
            command = list(request.argv) or self._default_command(image_id)
            if egress_call is not None:
                # The init's child is the relay, which execs the command: the tool keeps that
                # process, so its pid, streams and exit status are its own. (In the command, not
                # the entrypoint: `applied` reports the entrypoint, and need not carry the
                # relay's source in every result.)
                command = egress_call.relay_argv() + command
            try:
                container = self._create(
                    image_id,
                    command=command,
                    name=name,
                    labels=container_labels,
                    **kwargs,
                )
            except docker.errors.ImageNotFound as e:
                self._verified_images.pop(profile.image, None)  # the next call checks the engine again
                raise ImageError(f"pinned image {image_id} vanished from the engine: {e}") from e
            except docker.errors.APIError as e:
                return self._start_failed(profile, image_id, started, f"create failed: {e}")
            applied = applied_settings(container.attrs)
            self._inflight.track(request.run_id, container_id(container), progress)
            return self._attach_and_run(container, request, image_id, applied, started, progress)
        except ENGINE_ERRORS as e:
            if progress.start_issued:
                # The start request went out: the tool may be running or may have run, and its
                # effect may have happened. Never `start_failed` (which is retried).
                return self._failed(Outcome.UNCERTAIN, profile, image_id, started,
                                    f"engine error after the tool could have started: {type(e).__name__}: {e}")
            return self._start_failed(profile, image_id, started, f"engine error: {type(e).__name__}: {e}")
        finally:
            if container is not None:
                self._inflight.untrack(request.run_id, container_id(container))
                self._remove(container)
            if egress_call is not None:
                self._close_egress(request, egress_call, reports)

    def _workspace_missing(self, workspace: WorkspaceMount) -> str | None:
        """Why the call's workspace cannot be mounted, or None. Docker would create a named
        volume that does not exist: the run's workspace is gone (its run ended), or was never
        made, and the call must not run with another filesystem at /workspace."""
        source = workspace_source(workspace)
        try:
            labels = self._client.volumes.get(source).attrs.get("Labels") or {}
        except docker.errors.NotFound:
            return f"workspace volume {source} does not exist (the run's workspace is gone)"
        if WORKSPACE_LABEL not in labels:
            return f"volume {source} is not a ringfence workspace"
        return None

    def _close_egress(self, request: SandboxRequest, egress_call: CallEgress, reports: list[EgressReport]) -> None:
        """After the container is gone: revoke the credentials, close the call's socket, remove
        its directory, and collect the proxy's decisions."""
        report = self._egress().close_call(egress_call)
        reports.append(report)
        if self._on_egress_report is not None:
            self._on_egress_report(request, report)

    # -- warm containers (ringfence_server.sandbox.pool) ------------------------------------------------------

    def _load(self) -> Load:
        """What runs now, for the pool's refill to give way to (live calls first)."""
        with self._load_mutex:
            return Load(calls=self._calls, cold=self._cold)

    def _pool_shape(self, request: SandboxRequest, image_id: str | None = None) -> tuple[ShapeKey, ShapeSpec] | None:
        """The request's pool key and what a container of that shape is made from: everything
        fixed at creation (image, runtime, the full container settings of the profile without
        its per-call egress grant), and how the call is handed over (the runner reading its
        request, or the launcher for a command or credentials known only at the claim)."""
        profile = request.profile
        if not request.warm or (profile.egress is not None and profile.runtime != "runc"):
            return None
        image_id = image_id or self._image_id(profile.image)
        base = dataclasses.replace(profile, egress=None)
        mode = "runner" if not request.argv and profile.egress is None else "launcher"
        egress = profile.egress is not None
        spec: ShapeSpec = (image_id, base, mode, egress)
        # The settings' digest per shape, computed once (serialising them is not free per call).
        memo = repr(base)  # the profile holds dicts: not hashable, but its repr is exact
        fingerprint = self._shape_digests.get(memo)
        if fingerprint is None:
            settings = json.dumps(self._container_settings(base), sort_keys=True, default=repr)
            fingerprint = hashlib.sha256(settings.encode()).hexdigest()
            if len(self._shape_digests) < 256:
                self._shape_digests[memo] = fingerprint
        key: ShapeKey = (image_id, profile.runtime, mode, egress, fingerprint)
        if profile.workspace is not None:
            # The run's volume is in the settings (its mount), so in the key: a container made
            # for this shape serves this run's calls alone, and goes when the run ends (end_run).
            with self._run_shapes_mutex:
                self._run_shapes.setdefault(request.run_id, set()).add(key)
        return key, spec

    def _make_warm(self, key: ShapeKey, spec: ShapeSpec) -> Warm:
        """Create, attach and start one container of the shape: the same settings as a cold
        call's (one code path, _container_settings), blocked reading its stdin."""
        image_id, base, mode, egress = spec
        kwargs = self._container_settings(base)
        reserved = None
        if egress:
            reserved = self._egress().reserve_call_dir()
            kwargs = {**kwargs, "mounts": [*list(kwargs.get("mounts") or []), egress_mount(reserved[1])]}
        command = self._default_command(image_id) if mode == "runner" else LAUNCHER_ARGV
        assert self.pool is not None
        labels = L.base_labels("pool", deadline_s=self.pool.settings.idle_s + POOL_DEADLINE_MARGIN_S)
        container: Container | None = None
        try:
            container = self._create(image_id, command=command, name=f"rf-warm-{uuid.uuid4().hex[:12]}",
                                     labels=labels, **kwargs)
            applied = applied_settings(container.attrs)
            attach, sock = open_attach(self._client, container)
            try:
                container.start()
            except BaseException:
                close_attach(attach, sock)
                raise
        except BaseException:
            if container is not None:
                self._remove(container)
            if reserved is not None:
                self._egress().release_call_dir(reserved[1])
            raise
        return Warm(key, container, attach, sock, applied, image_id,
                    extra={"mode": mode, "egress_dir": reserved, "demux": Demuxer(), "early": []})

    def _discard_warm(self, warm: Warm) -> None:
        close_attach(warm.attach, warm.sock)
        self._remove(warm.container)
        reserved = warm.extra.get("egress_dir")
        if reserved is not None:
            self._egress().release_call_dir(reserved[1])

    def _rename(self, container: Container, name: str) -> None:
        with contextlib.suppress(*ENGINE_ERRORS):  # it ended already; this instance still kills it by id while it runs
            container.rename(name)

    @staticmethod
    def _remove(container: Container) -> None:
        engine.remove(container)

    def _run_warm(self, warm: Warm, request: SandboxRequest, reports: list[EgressReport]) -> SandboxResult:
        """The call in a container that was started before it: bound to the call now (its
        name, its egress credentials, its command when it is not the runner), then the same
        pump, wait and classification as a cold call, the wall time counted from here."""
        profile = request.profile
        started = time.monotonic()
        container = warm.container
        progress = Progress()
        egress_call: CallEgress | None = None
        registered = False
        try:
            env: dict[str, str] = {}
            if profile.egress is not None:
                try:
                    egress_call = self._egress().open_call(request.call_id, profile.egress,
                                                           reserved=warm.extra["egress_dir"])
                except EgressError as e:
                    return self._start_failed(profile, warm.image_id, started, f"egress: {e}")
                finally:
                    warm.extra["egress_dir"] = None  # the call's now: close_call removes it
                env = dict(egress_call.env)
            if warm.extra["mode"] == "launcher":
                command = list(request.argv) or self._default_command(warm.image_id)
                if egress_call is not None:
                    command = egress_call.relay_argv() + command
                payload = launch_line(command, env) + request.stdin
            else:
                payload = request.stdin
            # Labels are fixed at creation; the name is not: it says whose call this is, so that
            # kill_run finds it from any instance (ringfence_server.sandbox.pool.claimed_name). Renamed while the
            # request goes in (not before: a round trip less on the call's path); this instance
            # kills it by id meanwhile, another instance finds it once the rename is done.
            renaming = threading.Thread(target=self._rename, args=(container, claimed_name(request.run_id)),
                                        daemon=True)
            renaming.start()
            self._inflight.track(request.run_id, container_id(container), progress)
            registered = True
            streams = CappedStreams(profile.stdout_limit, profile.stderr_limit, bytearray(), bytearray(),
                                    on_output=request.on_output)
            for stream, data in warm.extra["early"]:
                streams.add(stream, data)
            try:
                if progress.killed_reason is not None:
                    return self._failed(Outcome.KILLED, profile, warm.image_id, started,
                                        f"not started: {progress.killed_reason}")
                progress.start_issued = True  # the request's first byte may reach the tool now
                run_started = time.monotonic()
                deadline = run_started + profile.timeout_s
                killed_for = self._pump(warm.sock, payload, streams, deadline, warm.extra["demux"])
            finally:
                close_attach(warm.attach, warm.sock)
                renaming.join()
            result = self._conclude(container, request, warm.image_id, warm.applied, started, run_started,
                                    deadline, progress, streams, killed_for)
            return dataclasses.replace(result, warm=True)
        except ENGINE_ERRORS as e:
            if progress.start_issued:
                return self._failed(Outcome.UNCERTAIN, profile, warm.image_id, started,
                                    f"engine error after the tool could have started: {type(e).__name__}: {e}")
            return self._start_failed(profile, warm.image_id, started, f"engine error: {type(e).__name__}: {e}")
        finally:
            if registered:
                self._inflight.untrack(request.run_id, container_id(container))
            close_attach(warm.attach, warm.sock)
            self._remover.later(container)
            reserved = warm.extra.get("egress_dir")
            if reserved is not None:
                self._egress().release_call_dir(reserved[1])
            if egress_call is not None:
                self._close_egress(request, egress_call, reports)

    def ping(self) -> None:
        """Raise EngineError unless the engine answers /_ping within a few seconds (the client's
        own timeout is 60 s, far too long for a health check)."""
        api = self._client.api
        try:
            # The versioned URL docker-py's own ping() asks (APIClient._url), with a timeout of its own.
            response = api.get(f"{api.base_url}/v{api.api_version}/_ping", timeout=5)
            response.raise_for_status()
        except ENGINE_ERRORS as e:
            raise EngineError(f"the Docker engine does not answer: {type(e).__name__}: {e}") from e

    def kill_all(self, reason: str) -> int:
        """Kill every container this backend has running (a SIGTERM to the CLI or the server):
        nothing of ours may outlive us with nobody enforcing its wall time. Each call ends
        `killed` with `reason`; the calls' own code then removes the containers."""
        targets = self._inflight.stop(reason)  # and nothing starts from now on
        killed = self._mcp.kill_all(reason) if self._mcp is not None else 0
        for _cid, progress in targets:
            progress.killed_reason = reason
        return killed + self._kill(cid for cid, _progress in targets)

    def kill_running(self, reason: str) -> int:
        """Kill every container this backend has running now, and go on serving: what a sandbox
        worker does when it is fenced (its lease lapsed: the control planes treat its calls as
        lost, so none of them may go on with nobody waiting), before it attaches again. Each
        call ends `killed` with `reason`. Returns how many were killed."""
        return self._kill(cid for cid, _progress in self._inflight.current(reason))

    def _kill(self, container_ids: Iterable[str]) -> int:
        """Kill each container; how many the engine killed (one that exited meanwhile is not)."""
        killed = 0
        for cid in container_ids:
            try:
                self._client.api.kill(cid)
                killed += 1
            except ENGINE_ERRORS:
                pass  # it exited meanwhile
        return killed

    def start_reaper(self, interval_s: float = 30.0) -> None:
        """Reap orphans now (a killed predecessor's containers) and then every `interval_s`
        (containers past their deadline label), until close()."""
        if self._reaper is None:
            self._reaper = PeriodicReaper(self._client, interval_s)
            self._reaper.start()

    def kill_run(self, run_id: str, reason: str) -> int:
        """Kill the run's containers now, ours and any other instance's (by label). Ours end
        `killed` with `reason`; the kill is the engine's, so setsid children die too."""
        self._inflight.mark_run(run_id, reason)
        killed = self._mcp.kill_run(run_id, reason) if self._mcp is not None else 0
        try:
            found = listing.containers(self._client, {"label": f"{L.RUN_LABEL}={run_id}"}, stopped=False)
            # Warm containers were created before their calls: their names say whose call they run.
            prefix = claimed_prefix(run_id)
            found += [c for c in listing.containers(self._client, {"name": prefix}, stopped=False)
                      if (c.name or "").startswith(prefix)]
        except ENGINE_ERRORS as e:
            raise EngineError(f"cannot list the run's containers: {e}") from e
        for container in found:
            try:
                container.kill()
                killed += 1
            except ENGINE_ERRORS:
                pass  # it exited meanwhile
        return killed

    def expect(self, requests: list[SandboxRequest]) -> None:
        """The pool makes ahead for these calls (ringfence_server.sandbox.pool.WarmPool.expect).
        An image the lock refuses or an engine that fails is the call's own result to report
        when it runs, not the hint's."""
        if self.pool is None or self._inflight.stopping is not None:
            return
        for request in requests:
            if request.mcp is not None:
                continue  # its session sandbox, never a pool container
            try:
                self.pool.expect(request)
            except (ImageError, *ENGINE_ERRORS):
                continue

    def end_run(self, run_id: str) -> int:
        """The run ended: its MCP session sandboxes close and are removed, and so are the warm
        containers made for its workspace (before the caller removes the workspace: a volume
        that a container mounts cannot be removed)."""
        self._inflight.end_run(run_id)
        ended = self._mcp.end_run(run_id) if self._mcp is not None else 0
        with self._run_shapes_mutex:
            shapes = self._run_shapes.pop(run_id, set())
        if shapes and self.pool is not None:
            ended += self.pool.forget(shapes)
        return ended

    def _default_command(self, image_id: str) -> list[str]:
        """The image's own Cmd: our entrypoint (tini with its flags) replaces the image's, and
        the engine then drops the image's Cmd too, so a request without argv names it."""
        if image_id not in self._image_cmds:
            config = self._client.images.get(image_id).attrs.get("Config") or {}  # the image's inspect
            self._image_cmds[image_id] = list(config.get("Cmd") or [])
        return self._image_cmds[image_id]

    def _create(self, image_id: str, **kwargs: Any) -> Container:
        """containers.create with our extra settings (ringfence_server.sandbox.engine.create_container)."""
        return engine.create_container(self._client, image_id, **kwargs)

    def _container_settings(self, profile: SandboxProfile) -> dict[str, Any]:
        # One place for the settings, so the escape battery can subclass and remove exactly one
        # protection to prove that its attack then succeeds. Nothing outside tests overrides it.
        return host_config_kwargs(profile, seccomp.profile_json(profile.runtime))

    def _start_failed(self, profile: SandboxProfile, image_id: str, started: float, message: str) -> SandboxResult:
        return self._failed(Outcome.START_FAILED, profile, image_id, started, message)

    @staticmethod
    def _failed(outcome: Outcome, profile: SandboxProfile, image_id: str, started: float,
                message: str) -> SandboxResult:
        return SandboxResult(
            outcome=outcome,
            exit_code=None,
            stdout=b"",
            stderr=b"",
            stdout_truncated=False,
            stderr_truncated=False,
            duration_ms=int((time.monotonic() - started) * 1000),
            image_id=image_id,
            runtime=profile.runtime,
            message=message,
        )

    def _attach_and_run(
        self, container: Container, request: SandboxRequest, image_id: str, applied: dict[str, Any], started: float,
        progress: Progress,
    ) -> SandboxResult:
        profile = request.profile
        attach, sock = open_attach(self._client, container)
        streams = CappedStreams(profile.stdout_limit, profile.stderr_limit, bytearray(), bytearray(),
                                on_output=request.on_output)
        killed_for: Outcome | None = None
        try:
            if progress.killed_reason is not None:
                return self._failed(Outcome.KILLED, profile, image_id, started,
                                    f"not started: {progress.killed_reason}")
            progress.start_issued = True
            try:
                container.start()
            except docker.errors.APIError as e:
                # The engine answered that it could not start the container: nothing ran.
                return self._start_failed(profile, image_id, started, f"start failed: {e}")
            finally:
                progress.started()
            if progress.killed():
                engine.kill(container)  # a kill_all that came between the check and the start
            run_started = time.monotonic()
            deadline = run_started + profile.timeout_s
            killed_for = self._pump(sock, request.stdin, streams, deadline, Demuxer())
        finally:
            close_attach(attach, sock)
        return self._conclude(container, request, image_id, applied, started, run_started, deadline, progress,
                              streams, killed_for)

    def _conclude(self, container: Container, request: SandboxRequest, image_id: str, applied: dict[str, Any],
                  started: float,
                  run_started: float, deadline: float, progress: Progress, streams: CappedStreams,
                  killed_for: Outcome | None) -> SandboxResult:
        """After the tool's streams ended (or it was cut): its exit, classified."""
        profile = request.profile
        if killed_for is None and progress.killed_reason is not None:
            killed_for = Outcome.KILLED  # we killed it (its 137 is not the OOM killer's)
        if killed_for is not None:
            engine.kill(container)
        remaining = max(deadline - time.monotonic(), 0) + 10
        try:
            status = container.wait(timeout=remaining)
            exit_code = status.get("StatusCode")
        except Exception:  # noqa: BLE001 - the engine did not report an exit within the deadline
            engine.kill(container)
            killed_for = killed_for or Outcome.TIMEOUT
            exit_code = None
        duration_ms = int((time.monotonic() - run_started) * 1000)
        container.reload()
        state = container.attrs.get("State") or {}
        if exit_code is None:
            exit_code = state.get("ExitCode")
        streams.finish()
        tool_ended = self._tool_ended(streams.witness)
        oom_killed = bool(state.get("OOMKilled"))
        if exit_code == 137 and killed_for is None and not oom_killed and not tool_ended:
            # SIGKILL from neither us nor (by its report) the OOM killer's usual victim: under
            # gVisor the OOM killer can take the whole sentry, and the engine then logs its
            # `oom` event after `die` without setting State.OOMKilled (seen 1 in 30 warm
            # calls). An outside kill (`docker kill`, another instance's kill_run) logs `kill`.
            oom_killed = engine_reported_oom(self._client, container.id or "", started)
        outcome = classify_exit(
            exit_code=exit_code, killed_for=killed_for, oom_killed=oom_killed, tool_ended=tool_ended,
        )
        said = explain(outcome, profile, exit_code=exit_code, killed_reason=progress.killed_reason,
                       tool_ended=tool_ended, stdout=bytes(streams.stdout), runner=not request.argv)
        return SandboxResult(
            outcome=outcome,
            exit_code=exit_code,
            stdout=bytes(streams.stdout),
            stderr=bytes(streams.stderr),
            stdout_truncated=streams.stdout_truncated,
            stderr_truncated=streams.stderr_truncated,
            duration_ms=duration_ms,
            image_id=image_id,
            runtime=profile.runtime,
            error_class=said.error_class,
            message=said.message,
            retry_after_s=said.retry_after_s,
            container_name=container.name or "",  # docker-py types it optional; a created container has one
            applied=applied,
            setup_ms=int((run_started - started) * 1000),
        )

    @staticmethod
    def _tool_ended(witness: InitWitness) -> bool:
        # One place, so the battery's red check can show what happens when it is not asked.
        return witness.tool_ended

    @staticmethod
    def _pump(sock: socket.socket, stdin: bytes, streams: CappedStreams, deadline: float,
              demux: Demux) -> Outcome | None:
        """ringfence_server.sandbox.streams.pump; one place, so a test can break the engine's connection here."""
        return pump(sock, stdin, streams, deadline, demux)
