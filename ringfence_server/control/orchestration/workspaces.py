"""A run's workspace, as the control loop sees it: asked for at StartRun, made then, removed
when the run ends, reaped when its run is gone.

    StartRun(workspace=...)  caps checked against [workspace] (0 = the default), refused when
                             this server keeps no workspaces; run_started records the ask, then
                             the workspace is made (ringfence_server.sandbox.workspace.WorkspaceStore.create)
                             and `workspace_created` appended. A StartRun sent again for a run
                             whose workspace was asked for but never made (the engine failed, a
                             crash came between) makes it then.
    the run ends             RunRepository.finish, whatever ended it (finish, cancel, deadline,
                             a ceiling, a halt, a failure): the workspace is removed and
                             `workspace_removed` appended just before `run_finished` (nothing is
                             appended after it: the store prunes only runs whose last event is
                             run_finished, and watchers stop there). If the engine fails then,
                             the run still ends; the reaper removes the workspace later.
    reap                     at start-up and every workspace.reap_interval_s: every workspace
                             whose run is finished or unknown to the store is removed.

The workspace's name derives from the deployment's scope and the run's store key (`volume_name`),
so any instance on the same store finds it and no other deployment on the engine does.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from ringfence.errors import FailedPrecondition, FieldViolation, InvalidArgument, Unavailable
from ringfence.model import RunOutcome, WorkspaceRequest
from ringfence_server.control.config import WorkspaceConfig
from ringfence_server.control.events import WorkspaceCreated, WorkspaceRemoved
from ringfence_server.control.orchestration.runs import RunRepository
from ringfence_server.control.state import RunState
from ringfence_server.sandbox.errors import EngineError, ProfileError
from ringfence_server.sandbox.workspace import MIN_BYTES, MIN_INODES, WorkspaceInfo, WorkspaceSpec, WorkspaceStore

log = logging.getLogger(__name__)


class RunWorkspaces:
    def __init__(self, *, repo: RunRepository, store: WorkspaceStore | None, config: WorkspaceConfig) -> None:
        self.repo = repo
        self.store = store
        self.config = config

    # -- StartRun ----------------------------------------------------------------------

    def spec_for(self, ask: WorkspaceRequest) -> WorkspaceSpec:
        """The caps of an asked-for workspace: 0 is the server's default; past the server's
        maximum (or under the sandbox's minimum) InvalidArgument naming workspace.bytes or
        workspace.inodes."""
        c = self.config
        violations: list[FieldViolation] = []
        values: dict[str, int] = {}
        for name, default, low, high, cap_key in (
                ("bytes", c.default_bytes, MIN_BYTES, c.max_bytes, "workspace.max_bytes"),
                ("inodes", c.default_inodes, MIN_INODES, c.max_inodes, "workspace.max_inodes")):
            value = getattr(ask, name, None)
            field = f"workspace.{name}"
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                violations.append(FieldViolation(field, "must be a non-negative integer (0: the server's default)"))
            elif value == 0:
                values[name] = default
            elif value > high:
                violations.append(FieldViolation(field, f"{value} is over this server's maximum of {high} "
                                                        f"({cap_key})"))
            elif value < low:
                violations.append(FieldViolation(field, f"{value} is under the minimum of {low}"))
            else:
                values[name] = value
        if violations:
            raise InvalidArgument("the workspace asked for is refused", violations)
        return WorkspaceSpec(bytes=values["bytes"], inodes=values["inodes"])

    def require_store(self) -> WorkspaceStore:
        if self.store is None:
            raise FailedPrecondition("this server keeps no workspaces (it runs without a workspace store); "
                                     "start the run without one")
        return self.store

    @staticmethod
    def require_live(state: RunState) -> None:
        """FailedPrecondition unless the run has a workspace that is still there (not removed at
        its end): what uploads and workspace downloads need."""
        if state.workspace is None:
            raise FailedPrecondition(f"run {state.run_id} has no workspace")
        if state.live_volume is None:
            raise FailedPrecondition(f"the workspace of run {state.run_id} is gone (the run ended)")

    def make_missing(self, state: RunState) -> None:
        """Make the workspace the run asked for at its start if it has none yet (the caller
        holds the run for writing, so it is made once)."""
        spec = self.missing(state)
        if spec is not None:
            self.create(state, spec)

    @staticmethod
    def asked(run_started: Mapping[str, Any]) -> WorkspaceSpec | None:
        """The workspace a run_started event recorded as asked for (None: none)."""
        ask = run_started.get("workspace")
        if not isinstance(ask, Mapping):
            return None
        return WorkspaceSpec(bytes=int(ask["bytes"]), inodes=int(ask["inodes"]))

    def create(self, state: RunState, spec: WorkspaceSpec) -> None:
        """Make the run's workspace and append `workspace_created` (the caller holds the run for
        writing). The engine failing is Unavailable: the run stands, and the same StartRun sent
        again makes the workspace. A name taken by something not this run's: FailedPrecondition."""
        store = self.require_store()
        try:
            volume = store.create(state.key, state.tenant, spec)
        except EngineError as e:
            raise Unavailable(f"the workspace of run {state.run_id} could not be made ({e}); send the same "
                              "StartRun again") from e
        except ProfileError as e:
            # The engine holds a volume or keeper of that name that is not this run's (labels
            # of another run or tenant): never adopted, never removed from here.
            raise FailedPrecondition(f"the workspace of run {state.run_id} could not be made: {e}") from e
        self.repo.append(state, WorkspaceCreated(volume=volume, bytes=spec.bytes, inodes=spec.inodes))

    def missing(self, state: RunState) -> WorkspaceSpec | None:
        """The workspace an unfinished run asked for at its start and does not have yet."""
        if state.finished or state.workspace is not None:
            return None
        first = self.repo.store.read(state.key, 1)[:1]
        return self.asked(first[0].data) if first else None

    # -- the run's end -----------------------------------------------------------------

    def remove(self, state: RunState, outcome: RunOutcome) -> None:
        """RunRepository.finish, just before run_finished: remove the workspace, append
        `workspace_removed` (reason: the run's outcome). An engine failure is logged and
        left to the reaper: the run ends regardless."""
        volume = state.live_volume
        if volume is None:
            return
        if self.store is None:
            log.warning("run %s ends with workspace %s, but this server keeps no workspaces: an instance "
                        "that does will reap it", state.run_id, volume)
            return
        try:
            self.store.remove(state.key)
        except EngineError as e:
            log.warning("run %s: could not remove workspace %s (%s); the reaper will", state.run_id, volume, e)
            return
        self.repo.append(state, WorkspaceRemoved(volume=volume, reason=outcome.value))

    # -- reaping -----------------------------------------------------------------------

    def reap(self) -> int:
        """Remove every workspace whose run is finished or unknown to the store; returns how
        many. Nothing is appended: such a run's log ended at run_finished (its workspace counts
        as removed from there), or there is no log."""
        if self.store is None:
            return 0
        store = self.repo.store
        # One query for the common case; a workspace not in it is asked about one by one (its
        # run may have started since the query: the workspace is made after run_started).
        unfinished = set(store.unfinished())

        def keep(info: WorkspaceInfo) -> bool:
            if (info.tenant, info.run_key) in unfinished:
                return True
            tenant = store.tenant_of(info.run_key)
            if tenant is None or tenant != info.tenant:
                log.info("reaping workspace %s: its run %s is unknown", info.volume, info.run_key)
                return False
            state = self.repo.by_key(tenant, info.run_key)
            if state is None or state.finished:
                log.info("reaping workspace %s: its run %s has ended", info.volume, info.run_key)
                return False
            return True

        return self.store.reap(keep)
