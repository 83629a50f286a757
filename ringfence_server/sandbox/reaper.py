"""Removes the Docker objects of ringfence instances that are gone.

An object is an orphan when its deadline label has passed (every call container carries one:
its wall limit plus a grace period), or when it belongs to an instance on this host whose
process no longer exists. Objects of live instances within their deadline are never touched,
so two control planes on one engine do not reap each other's calls.

An egress proxy's host state directory (its config, control socket and every live call's
socket directory, ringfence_server.sandbox.egress.proxy) goes with its container: a process that died could not
remove it itself. Networks labelled ringfence are still reaped too (the proxy's own bridge, and
those of earlier versions that gave each egress call a network of its own).

A workspace's keeper (ringfence_server.sandbox.workspace) belongs to a run, not to the instance that happened to
make it: another instance continues the run with the same files, so a keeper is never an
instance's orphan. The control plane reaps workspaces by their runs (`WorkspaceStore.reap`).
A stray workspace volume (one the engine made by itself for a call whose workspace was removed
meanwhile: ringfence_server.sandbox.hardening.STRAY_WORKSPACE_PURPOSE) is removed once no container uses it
(`reap_stray_volumes`, on the server's periodic pass).
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

import docker
import docker.errors
from docker.models.containers import Container
from docker.models.networks import Network

from ringfence_server.sandbox import labels as L
from ringfence_server.sandbox import listing
from ringfence_server.sandbox.egress.proxy import CONTROL_DIR, STATE_PREFIX
from ringfence_server.sandbox.hardening import STRAY_WORKSPACE_PURPOSE

log = logging.getLogger(__name__)


# Objects that are not an instance's: never reaped by their instance's labels (see above).
RUN_OWNED_PURPOSES = frozenset({"workspace-keeper"})


@dataclass(frozen=True)
class Reaped:
    kind: str  # "container" | "network" | "directory" | "volume"
    name: str
    reason: str


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def orphan_reason(labels: dict[str, str], *, now: float, host: str) -> str | None:
    """Why an object with these labels is an orphan, or None if its owner may still need it."""
    if labels.get(L.PURPOSE_LABEL) in RUN_OWNED_PURPOSES:
        return None  # its run's, whichever instance made it
    deadline = labels.get(L.DEADLINE_LABEL)
    if deadline and deadline.isdigit() and int(deadline) < now:
        return "past its deadline"
    if labels.get(L.HOST_LABEL) == host:
        pid = labels.get(L.PID_LABEL, "")
        if pid.isdigit() and not _pid_alive(int(pid)):
            return f"owner process {pid} is gone"
    return None


def proxy_state_dir(attrs: dict[str, Any], labels: dict[str, str], *, host: str) -> str | None:
    """The host state directory of an egress proxy container, when it is one of ours on this
    host: bind-mounted at the proxy's control dir, named by its prefix, a real directory."""
    if labels.get(L.PURPOSE_LABEL) != "proxy" or labels.get(L.HOST_LABEL) != host:
        return None
    for m in attrs.get("Mounts") or []:
        source = m.get("Source") or ""
        if (m.get("Type") == "bind" and m.get("Destination") == CONTROL_DIR
                and os.path.basename(source).startswith(STATE_PREFIX)
                and os.path.isdir(source) and not os.path.islink(source)):
            return source
    return None


def _name(obj: Container | Network) -> str:
    # docker-py types `name` as optional (it reads attrs["Name"]); an object the engine lists
    # always has one, and its short id would still say which it was.
    return obj.name or obj.short_id


def reap(client: docker.DockerClient, *, now: float | None = None) -> list[Reaped]:
    """Remove orphaned ringfence containers, then networks; return what was removed."""
    now = time.time() if now is None else now
    host = socket.gethostname()
    selector: dict[str, str | list[str] | bool] = {"label": f"{L.PRODUCT_LABEL}={L.PRODUCT}"}
    reaped: list[Reaped] = []
    # Another process (an instance, a test, another reaper) may remove what we just listed:
    # ringfence_server.sandbox.listing leaves it out, and a removal that finds it gone is no failure.
    for container in listing.containers(client, selector):
        reason = orphan_reason(container.labels, now=now, host=host)
        if reason:
            try:
                container.remove(force=True)
                reaped.append(Reaped("container", _name(container), reason))
            except docker.errors.NotFound:
                continue
            state = proxy_state_dir(container.attrs, container.labels, host=host)
            if state is not None:
                shutil.rmtree(state, ignore_errors=True)
                reaped.append(Reaped("directory", state, f"state of proxy {_name(container)}: {reason}"))
    for network in listing.networks(client, selector):
        reason = orphan_reason(network.attrs.get("Labels") or {}, now=now, host=host)
        if reason:
            try:
                network.reload()
                for member in network.containers:
                    network.disconnect(member, force=True)
                network.remove()
                reaped.append(Reaped("network", _name(network), reason))
            except docker.errors.NotFound:
                pass
    return reaped


def reap_stray_volumes(client: docker.DockerClient) -> list[Reaped]:
    """Remove stray workspace volumes no container uses (one in use is left for next time)."""
    reaped: list[Reaped] = []
    selector = {"label": [f"{L.PRODUCT_LABEL}={L.PRODUCT}", f"{L.PURPOSE_LABEL}={STRAY_WORKSPACE_PURPOSE}"]}
    for volume in listing.volumes(client, selector):
        try:
            volume.remove()
            reaped.append(Reaped("volume", str(volume.name), "a stray workspace volume"))
        except docker.errors.APIError:
            pass  # gone already, or a call still has it mounted
    return reaped


class PeriodicReaper:
    """reap() at start and then every `interval_s` on a daemon thread, until stop(): a server
    removes its killed predecessor's containers at start-up and anything past its deadline
    label while it runs, not only when someone runs `sandbox gc`."""

    def __init__(self, client: docker.DockerClient, interval_s: float) -> None:
        self._client = client
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rf-reaper", daemon=True)
        self.reaped: list[Reaped] = []

    def start(self) -> None:
        self.reap_once()
        self._thread.start()

    def reap_once(self) -> list[Reaped]:
        try:
            found = reap(self._client) + reap_stray_volumes(self._client)
        except Exception as e:  # noqa: BLE001 - the engine may be down now; the next round retries
            log.warning("reaper: %s", e)
            return []
        for item in found:
            log.info("reaper: removed %s %s (%s)", item.kind, item.name, item.reason)
        self.reaped.extend(found)
        return found

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.reap_once()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
