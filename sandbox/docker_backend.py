"""DockerBackend: one call, one fresh hardened container, one classified result.

The hardening is fixed here, not in the profile, so no caller can opt out of it:
non-root uid:gid, read-only root, every capability dropped, no-new-privileges, our seccomp
profile (Docker's default, tightened), private IPC, tini as PID 1 (inside the image), no network,
no host env, no host mounts but declared read-only inputs, a noexec size-capped /tmp, ulimits.

The call's stdin is written through an attach socket, stdout and stderr are read from the same
socket with byte caps, and the wall time is enforced by killing the container (killing a client
process would leave `setsid` children alive). The container is removed whatever happens.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import select
import socket
import struct
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import docker
import docker.errors
from docker.types import LogConfig, Mount, Ulimit

from sandbox import labels as L
from sandbox import etc_files, seccomp
from sandbox.backend import SandboxRequest
from sandbox.errors import EngineError, ImageError, ProfileError
from sandbox.profile import ENGINE_RUNTIME, SandboxProfile
from sandbox.result import Outcome, SandboxResult, ToolErrorClass, classify_exit

# The runner (images/tool) exits with this status after writing a structured tool error.
RUNNER_TOOL_ERROR_EXIT = 3
_STDOUT, _STDERR = 1, 2
_HOSTNAME = etc_files.HOSTNAME
# DNS: a resolver on the sandbox's own loopback where nothing listens. Docker would otherwise
# copy the host's resolv.conf in, and a query name is an exfiltration channel.
_DNS = ["127.0.0.1"]
GVISOR_PIDS_OVERHEAD = 64


def host_config_kwargs(profile: SandboxProfile, seccomp_json: str) -> dict[str, Any]:
    """The container settings for `profile`: every hardening point, no switches."""
    return dict(
        user=profile.user,
        read_only=True,
        cap_drop=["ALL"],
        security_opt=["no-new-privileges:true", f"seccomp={seccomp_json}"],
        privileged=False,
        ipc_mode="private",
        # A private cgroup namespace: the sandbox sees its own cgroup as the root, not the
        # engine's /docker/<id> path (a host path in mountinfo, case 16).
        cgroupns="private",
        network_mode="none",
        dns=_DNS,
        dns_search=["."],
        hostname=_HOSTNAME,
        mem_limit=profile.memory_bytes,
        memswap_limit=profile.memory_bytes,
        nano_cpus=int(profile.cpus * 1e9),
        # Under gVisor the pids cgroup also counts the sentry's own host threads (about 48 at
        # start), so the tool's budget is added on top of that overhead.
        pids_limit=profile.pids + (GVISOR_PIDS_OVERHEAD if profile.runtime == "gvisor" else 0),
        ulimits=[
            Ulimit(name="nofile", soft=profile.nofile, hard=profile.nofile),
            Ulimit(name="fsize", soft=profile.fsize_bytes, hard=profile.fsize_bytes),
            Ulimit(name="core", soft=0, hard=0),
        ],
        tmpfs={"/tmp": f"rw,noexec,nosuid,nodev,size={profile.tmpfs_bytes},mode=1777"},
        mounts=etc_files.mounts()
        + [
            Mount(target=m.container_path, source=m.host_path, type="bind", read_only=True)
            for m in profile.inputs
        ],
        environment=dict(profile.env),
        working_dir=profile.workdir,
        runtime=ENGINE_RUNTIME[profile.runtime],
        # Output is read through the attach socket; a log driver would also copy a flood to disk.
        log_config=LogConfig(type=LogConfig.types.NONE),
        init=False,
        stdin_open=True,
        tty=False,
        # detach=False is what makes docker-py set StdinOnce: closing our write half then closes
        # the tool's stdin instead of ending the whole attach session.
        detach=False,
    )


def applied_settings(attrs: dict[str, Any]) -> dict[str, Any]:
    """The hardening as the engine reports it for the created container (`docker inspect`)."""
    host = attrs.get("HostConfig") or {}
    config = attrs.get("Config") or {}
    security_opt = []
    for opt in host.get("SecurityOpt") or []:
        # The seccomp entry holds the whole profile; show which profile instead.
        if opt.startswith("seccomp="):
            body = opt[len("seccomp="):]
            name = "unconfined" if body == "unconfined" else "ringfence-default"
            digest = next(
                (seccomp.profile_digest(rt) for rt in ("runc", "gvisor") if body == seccomp.profile_json(rt)),
                "unknown",
            )
            security_opt.append(f"seccomp={name} ({digest})")
        else:
            security_opt.append(opt)
    return {
        "user": config.get("User"),
        "read_only": host.get("ReadonlyRootfs"),
        "cap_drop": host.get("CapDrop"),
        "cap_add": host.get("CapAdd"),
        "privileged": host.get("Privileged"),
        "security_opt": security_opt,
        "network_mode": host.get("NetworkMode"),
        "ipc_mode": host.get("IpcMode"),
        "cgroupns": host.get("CgroupnsMode"),
        "memory": host.get("Memory"),
        "memory_swap": host.get("MemorySwap"),
        "nano_cpus": host.get("NanoCpus"),
        "pids_limit": host.get("PidsLimit"),
        "tmpfs": host.get("Tmpfs"),
        "ulimits": [
            {"name": u.get("Name"), "soft": u.get("Soft"), "hard": u.get("Hard")}
            for u in host.get("Ulimits") or []
        ],
        "runtime": host.get("Runtime"),
        "dns": host.get("Dns"),
        "mounts": [
            {"source": m.get("Source"), "target": m.get("Target"), "read_only": m.get("ReadOnly")}
            for m in host.get("Mounts") or []
        ],
        "env": _redact_proxy_credentials(config.get("Env")),  # issue 4 (egress)
    }


def _redact_proxy_credentials(env: list[str] | None) -> list[str] | None:
    """Issue 4 (egress): the proxy URL in the env carries the call's password; results and
    events keep the variable (and the user name) but never the password."""
    if not env:
        return env
    out = []
    for item in env:
        name, sep, value = item.partition("=")
        if sep and name.lower() in ("http_proxy", "https_proxy", "all_proxy") and "@" in value:
            scheme, _, rest = value.partition("://")
            userinfo, _, hostport = rest.rpartition("@")
            value = f"{scheme}://{userinfo.split(':', 1)[0]}:***@{hostport}"
        out.append(f"{name}{sep}{value}")
    return out


@dataclass
class _Streams:
    """Output read so far, capped; `over` names the first stream that went past its cap."""

    stdout_limit: int
    stderr_limit: int
    stdout: bytearray
    stderr: bytearray
    stdout_truncated: bool = False
    stderr_truncated: bool = False

    def add(self, stream: int, data: bytes) -> bool:
        """Keep what fits; return True when a cap was exceeded."""
        if stream == _STDERR:
            room = self.stderr_limit - len(self.stderr)
            self.stderr += data[: max(room, 0)]
            if len(data) > room:
                self.stderr_truncated = True
        else:
            room = self.stdout_limit - len(self.stdout)
            self.stdout += data[: max(room, 0)]
            if len(data) > room:
                self.stdout_truncated = True
        return self.stdout_truncated or self.stderr_truncated


class _Demuxer:
    """Splits Docker's multiplexed attach stream (8-byte headers) into (stream, bytes) frames."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        self._buf += data
        frames = []
        while len(self._buf) >= 8:
            stream, size = self._buf[0], struct.unpack(">I", self._buf[4:8])[0]
            if len(self._buf) < 8 + size:
                # Hand over a partial frame's payload now so a frame larger than the cap is
                # seen (and cut) without buffering all of it.
                if len(self._buf) > 8:
                    payload = bytes(self._buf[8:])
                    frames.append((stream, payload))
                    self._buf = bytearray(self._buf[:8])
                    struct.pack_into(">I", self._buf, 4, size - len(payload))
                break
            frames.append((stream, bytes(self._buf[8 : 8 + size])))
            del self._buf[: 8 + size]
        return frames


class DockerBackend:
    """Runs each request in a fresh container on the local engine."""

    def __init__(self, client: docker.DockerClient | None = None, *, lock: Any = None,
                 egress_proxy: Any = None, on_egress_report: Any = None) -> None:
        try:
            self._client = client or docker.from_env(timeout=60)
            self._client.ping()
        except docker.errors.DockerException as e:
            raise EngineError(f"cannot reach the Docker engine: {e}") from e
        self._lock = lock
        self._runtimes: set[str] | None = None
        # Issue 4 (egress), additive: the egress proxy (sandbox.egress.proxy.EgressProxy) for
        # calls whose profile has an egress grant; created on first use unless one is given.
        # `on_egress_report(request, EgressReport)` receives each call's proxy decisions.
        self._egress_proxy = egress_proxy
        self._owns_egress_proxy = egress_proxy is None
        self._egress_mutex = threading.Lock()
        self._on_egress_report = on_egress_report

    @property
    def client(self) -> docker.DockerClient:
        return self._client

    def close(self) -> None:
        if self._owns_egress_proxy and self._egress_proxy is not None:  # issue 4 (egress)
            self._egress_proxy.close()
            self._egress_proxy = None
        self._client.close()

    def _egress(self):
        """Issue 4 (egress): the egress proxy, started on the first egress call."""
        with self._egress_mutex:
            if self._egress_proxy is None:
                from sandbox.egress.proxy import EgressProxy

                self._egress_proxy = EgressProxy(self._client, lock=self._lock)
            return self._egress_proxy

    def _apply_egress(self, settings: dict[str, Any], call: Any) -> dict[str, Any]:
        """Issue 4 (egress): instead of network_mode none, the call's own internal network
        (whose only other member is the proxy) and the proxy URL with the call's credentials.
        dns stays 127.0.0.1: Docker's embedded resolver on that network forwards unknown
        names there, i.e. into the sandbox's own loopback, where nothing answers. Tests
        subclass this to bypass the proxy and show what it stops."""
        settings = dict(settings)
        settings["network_mode"] = call.network
        settings["environment"] = {**dict(settings.get("environment") or {}), **dict(call.env)}
        return settings

    def runtimes(self) -> set[str]:
        if self._runtimes is None:
            self._runtimes = set((self._client.info().get("Runtimes") or {}).keys())
        return self._runtimes

    def _image_id(self, name: str) -> str:
        from sandbox.images import load_lock, resolve_pinned  # the lock lives with the builder

        if self._lock is None:
            # Read once, on first dispatch (not at construction: a backend may exist before
            # `make images`). A server keeps trusting the lock it started with.
            self._lock = load_lock()
        return resolve_pinned(self._client, name, self._lock)

    def run(self, request: SandboxRequest) -> SandboxResult:
        reports: list[Any] = []
        result = self._run(request, reports)
        if reports and reports[0].events:
            # The proxy's decisions arrive when the call's credentials are revoked, after the
            # container is gone: they become part of the call's result.
            result = dataclasses.replace(result, egress_events=tuple(reports[0].events))
        return result

    def _run(self, request: SandboxRequest, reports: list[Any]) -> SandboxResult:
        profile = request.profile
        image_id = self._image_id(profile.image)
        if profile.runtime == "gvisor" and "runsc" not in self.runtimes():
            raise ProfileError("runtime", "the engine has no runsc runtime (run `make gvisor`)")
        name = f"rf-{request.run_id[:24]}-{request.call_id[:24]}-{uuid.uuid4().hex[:6]}".replace(":", "_")
        container_labels = L.base_labels("call", deadline_s=profile.timeout_s + 60)
        container_labels.update({L.RUN_LABEL: request.run_id, L.CALL_LABEL: request.call_id})
        kwargs = self._container_settings(profile)
        started = time.monotonic()
        container = None
        egress_call = None  # issue 4 (egress)
        try:
            if profile.egress is not None:  # issue 4 (egress)
                if profile.runtime != "runc":
                    raise ProfileError("egress", "egress tools run on runc only")
                from sandbox.egress.channel import EgressError

                try:
                    egress_call = self._egress().open_call(
                        request.call_id, profile.egress, run_id=request.run_id, deadline_s=profile.timeout_s + 60)
                except EgressError as e:
                    return self._start_failed(profile, image_id, started, f"egress: {e}")
                kwargs = self._apply_egress(kwargs, egress_call)
            try:
                container = self._client.containers.create(
                    image_id,
                    command=list(request.argv) or None,
                    name=name,
                    labels=container_labels,
                    **kwargs,
                )
            except docker.errors.ImageNotFound as e:
                raise ImageError(f"pinned image {image_id} vanished from the engine: {e}") from e
            except docker.errors.APIError as e:
                return self._start_failed(profile, image_id, started, f"create failed: {e}")
            applied = applied_settings(container.attrs)
            return self._attach_and_run(container, request, image_id, applied, started)
        except docker.errors.DockerException as e:
            return self._start_failed(profile, image_id, started, f"engine error: {e}")
        finally:
            if container is not None:
                try:
                    container.remove(force=True)
                except docker.errors.NotFound:
                    pass
                except docker.errors.DockerException:
                    # The reaper removes it later by label; the result stands.
                    pass
            if egress_call is not None:  # issue 4 (egress): revoke credentials, drop network
                report = self._egress().close_call(egress_call)
                reports.append(report)
                if self._on_egress_report is not None:
                    self._on_egress_report(request, report)

    def _container_settings(self, profile: SandboxProfile) -> dict[str, Any]:
        # One place for the settings, so the escape battery can subclass and remove exactly one
        # protection to prove that its attack then succeeds. Nothing outside tests overrides it.
        return host_config_kwargs(profile, seccomp.profile_json(profile.runtime))

    def _start_failed(self, profile: SandboxProfile, image_id: str, started: float, message: str) -> SandboxResult:
        return SandboxResult(
            outcome=Outcome.START_FAILED,
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
        self, container, request: SandboxRequest, image_id: str, applied: dict, started: float
    ) -> SandboxResult:
        profile = request.profile
        api = self._client.api
        attach = api.attach_socket(
            container.id, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
        )
        sock: socket.socket = getattr(attach, "_sock", attach)
        streams = _Streams(profile.stdout_limit, profile.stderr_limit, bytearray(), bytearray())
        killed_for: Outcome | None = None
        try:
            try:
                container.start()
            except docker.errors.APIError as e:
                return self._start_failed(profile, image_id, started, f"start failed: {e}")
            run_started = time.monotonic()
            deadline = run_started + profile.timeout_s
            killed_for = self._pump(sock, request.stdin, streams, deadline)
        finally:
            # Close before killing: the engine will not finish a kill while its copy of the
            # container's output is blocked on a socket nobody reads any more.
            # shutdown, not only close: the HTTP response object still holds the fd open.
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            try:
                attach.close()
                sock.close()
            except OSError:
                pass
        if killed_for is not None:
            self._kill(container)
        remaining = max(deadline - time.monotonic(), 0) + 10
        try:
            status = container.wait(timeout=remaining)
            exit_code = status.get("StatusCode")
        except Exception:  # the engine did not report an exit within the deadline
            self._kill(container)
            killed_for = killed_for or Outcome.TIMEOUT
            exit_code = None
        duration_ms = int((time.monotonic() - run_started) * 1000)
        container.reload()
        state = container.attrs.get("State") or {}
        if exit_code is None:
            exit_code = state.get("ExitCode")
        outcome = classify_exit(
            exit_code=exit_code, killed_for=killed_for, oom_killed=bool(state.get("OOMKilled"))
        )
        error_class, message, retry_after = None, "", None
        if outcome is Outcome.TOOL_ERROR:
            error_class, message, retry_after = _tool_error(request, exit_code, bytes(streams.stdout))
        elif outcome is Outcome.OOM:
            message = f"memory limit of {profile.memory_bytes} bytes reached"
        elif outcome is Outcome.TIMEOUT:
            message = f"wall time of {profile.timeout_s}s reached; container killed"
        elif outcome is Outcome.OUTPUT_LIMIT:
            message = "output cap reached; container killed"
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
            error_class=error_class,
            message=message,
            retry_after_s=retry_after,
            container_name=container.name,
            applied=applied,
        )

    @staticmethod
    def _pump(sock: socket.socket, stdin: bytes, streams: _Streams, deadline: float) -> Outcome | None:
        """Write stdin and read output until EOF, the deadline, or a cap. Returns why we must
        kill the container, or None when it ended on its own."""
        sock.setblocking(False)
        pending = memoryview(stdin)
        if not pending:
            sock.shutdown(socket.SHUT_WR)
        demux = _Demuxer()
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return Outcome.TIMEOUT
            want_write = [sock] if pending else []
            readable, writable, _ = select.select([sock], want_write, [], min(left, 1.0))
            if writable and pending:
                try:
                    sent = sock.send(pending[:65536])
                    pending = pending[sent:]
                except BlockingIOError:
                    pass
                except OSError as e:  # the tool closed stdin without reading it all
                    if e.errno not in (errno.EPIPE, errno.ECONNRESET):
                        raise
                    pending = memoryview(b"")
                if not pending:
                    try:
                        sock.shutdown(socket.SHUT_WR)
                    except OSError:
                        pass
            if readable:
                try:
                    data = sock.recv(65536)
                except BlockingIOError:
                    continue
                except ConnectionResetError:
                    return None
                if not data:
                    return None
                for stream, payload in demux.feed(data):
                    if streams.add(stream, payload):
                        return Outcome.OUTPUT_LIMIT

    @staticmethod
    def _kill(container) -> None:
        try:
            container.kill()
        except docker.errors.APIError:
            pass  # already exited


def _tool_error(request: SandboxRequest, exit_code: int | None, stdout: bytes):
    """The tool's own classified error when the runner reported one; otherwise `fatal`."""
    if not request.argv and exit_code == RUNNER_TOOL_ERROR_EXIT:
        try:
            line = stdout.strip().splitlines()[-1]
            body = json.loads(line)
            error = body["error"]
            cls = ToolErrorClass(error["class"])
            retry_after = error.get("retry_after_s")
            return cls, str(error.get("message", "")), (float(retry_after) if retry_after is not None else None)
        except (ValueError, KeyError, IndexError, TypeError):
            return ToolErrorClass.FATAL, "runner reported an error it could not describe", None
    return ToolErrorClass.FATAL, f"exited with status {exit_code}", None
