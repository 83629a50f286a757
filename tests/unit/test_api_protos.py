"""The generated code is current, lives in the client as ringfence.v1 (and imports nothing else of
ours), and every RPC in the protos is covered by the role table and the status table."""

from __future__ import annotations

import filecmp
import importlib
from pathlib import Path

import grpc
from google.rpc import code_pb2

from ringfence_server.control.api import auth, protos_gen, status
from ringfence_server.control.api.servicer import PROTO_MODULES, SERVICE_NAMES

GEN = protos_gen.GEN_DIR


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def test_committed_generated_code_is_current(tmp_path):
    out = tmp_path / "gen"
    protos_gen.generate(out)
    fresh, committed = _tree(out), _tree(GEN)
    assert sorted(fresh) == sorted(committed), "files differ: run `make protos`"
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"stale or hand-edited generated files (run `make protos`): {stale}"


def test_staleness_check_notices_a_proto_change(tmp_path):
    # The red check for the test above: a changed .proto must produce different code.
    protos = tmp_path / "protos"
    (protos / "ringfence" / "v1").mkdir(parents=True)
    for f in protos_gen.proto_files():
        text = f.read_text()
        if f.name == "tools.proto":
            text = text.replace("string query = 1;", "string query = 1;\n  uint32 limit = 2;")
        (protos / "ringfence" / "v1" / f.name).write_text(text)
    protos_gen.generate(tmp_path / "gen", proto_root=protos)
    assert not filecmp.cmp(tmp_path / "gen/tools_pb2.py", GEN / "tools_pb2.py", shallow=False)


def test_generated_modules_are_the_clients_ringfence_v1():
    import re

    for path in sorted(p for p in GEN.rglob("*") if p.suffix in (".py", ".pyi")):
        ours = set(re.findall(r"(?:from|import) (ringfence[\w.]*)", path.read_text()))
        assert ours <= {"ringfence.v1"} | {n for n in ours if n.startswith("ringfence.v1.")}, (path, ours)
    for module in PROTO_MODULES:
        assert module.__name__.startswith("ringfence.v1.")
    for name in ("tools_pb2_grpc", "runs_pb2_grpc", "approvals_pb2_grpc"):
        importlib.import_module(f"ringfence.v1.{name}")


def test_every_rpc_has_a_role_entry_and_nothing_else_does():
    methods = {
        f"/{service.full_name}/{m.name}"
        for module in PROTO_MODULES
        for service in module.DESCRIPTOR.services_by_name.values()
        for m in service.methods
    }
    assert methods == set(auth.METHOD_ROLES)
    assert set(SERVICE_NAMES) == {"ringfence.v1.ToolService", "ringfence.v1.RunService", "ringfence.v1.ApprovalService",
                                  "ringfence.v1.PlanService", "ringfence.v1.EvidenceService",
                                  "ringfence.v1.RoutingService", "ringfence.v1.FileService",
                                  "ringfence.v1.IdentityService"}


def test_status_table_codes_agree_with_google_rpc_code():
    for code in status.CODES.values():
        assert code.value[0] == getattr(code_pb2, code.name)
    # A bug answers INTERNAL, and no known error does: seeing INTERNAL means a bug was found.
    assert status.UNEXPECTED_CODE is grpc.StatusCode.INTERNAL
    assert grpc.StatusCode.INTERNAL not in status.CODES.values()
