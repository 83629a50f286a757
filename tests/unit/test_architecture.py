"""The import rules of docs/ARCHITECTURE.md, checked on the source: the architecture as a graph.

Two distributions: the client `ringfence` (client/ringfence/) and the server `ringfence-server`
(ringfence_server/: control, sandbox, imagebuild, conformance, demo_services).

- the client imports nothing of the server: `pip install ringfence` must work without it;
- sandbox imports nothing from control: an executor that knows policy can be talked into
  permitting itself;
- neither do the packages beside it that use the sandbox (imagebuild, the image toolchain;
  conformance, the `ringfence conformance` suite; demo_services, the demo services);
- sandbox imports nothing from those three but the lock it runs by, which it owns
  (sandbox.pinned_images): running a call never loads the image builder, the suite or a demo;
- control.registry never imports control.policy: a tool must not describe itself as permitted;
- the wire (the client's generated ringfence.v1 and its ringfence.wire conversions) is imported
  only at the server's edge (control.api, control.workers: the workers' stream, the CLI's
  extension, the demo);
- control.orchestration is imported by nothing but the edge (and itself);
- the console imports nothing of the server but control.tracing (pure rendering) and control.netloc
  (what a loopback host is, the rule every listener shares): it reaches the
  control plane through the client, with the signed-in person's token;
- the worker (ringfence_server/worker: sandbox workers on other hosts, docs/workers.md) imports
  nothing of the control plane but control.validation (the canonical JSON an envelope's arguments
  are in): a worker holds no store, no policy, no approvals, no tokens; and the sandbox imports
  nothing of the worker (the worker uses it, never the other way round).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    try:
        package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    except ValueError:  # a file outside the tree (the checker's own red test)
        package = ""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


S = "ringfence_server"  # the server distribution's one top-level package


def modules(package: str):
    """The source files of ringfence_server.PACKAGE."""
    for path in sorted((ROOT / S / package).rglob("*.py")):
        if "gen" in path.relative_to(ROOT).parts:
            continue
        yield path


def offenders(paths, predicate) -> list[str]:
    return [
        f"{p.relative_to(ROOT)} imports {name}"
        for p in paths
        for name in sorted(imports_of(p))
        if predicate(name)
    ]


def is_edge(path: Path) -> bool:
    rel = path.relative_to(ROOT / S).as_posix()
    # control/demo/ runs a server in-process and drives it as a user would (through the client): an edge too.
    # control/workers/ is the sandbox workers' gRPC edge (their Attach stream), as control/api/ is the tenants'.
    return rel.startswith(("control/api/", "control/demo/", "control/workers/")) or rel == "control/cli.py"


def test_the_client_imports_nothing_of_the_server():
    client = sorted((ROOT / "client" / "ringfence").rglob("*.py"))
    assert client, "the client's sources moved: update this rule"
    assert offenders(client, lambda n: n == S or n.startswith(f"{S}.")) == []


def test_sandbox_imports_nothing_from_control():
    assert offenders(modules("sandbox"), from_package("control")) == []


# The packages that use the sandbox runtime from beside it, never the other way round.
SANDBOX_USERS = ("imagebuild", "conformance", "demo_services")


def from_package(*packages: str):
    """A predicate: does an imported name belong to one of ringfence_server's `packages`?"""
    full = [f"{S}.{p}" for p in packages]
    return lambda name: any(name == p or name.startswith(f"{p}.") for p in full)


def test_the_sandbox_users_import_nothing_from_control():
    for package in SANDBOX_USERS:
        assert offenders(modules(package), from_package("control")) == [], package


def test_sandbox_imports_nothing_from_its_users():
    # The lock it runs by is ringfence_server.sandbox.pinned_images, its own: imagebuild imports it from there.
    assert offenders(modules("sandbox"), from_package(*SANDBOX_USERS)) == []


def test_registry_never_imports_policy():
    registry = [p for p in modules("control") if p.stem == "registry" or "registry" in p.parts]
    assert offenders(registry, lambda n: "policy" in n.split(".")) == []


def test_generated_protos_only_at_the_edge():
    core = [p for p in modules("control") if not is_edge(p)]
    wire = ("ringfence.v1", "ringfence.wire", f"{S}.control.api")
    assert offenders(core, lambda n: n.startswith(wire) or n.endswith(("_pb2", "_pb2_grpc"))) == []


def test_only_the_edge_depends_on_orchestration():
    core = [p for p in modules("control") if not is_edge(p) and "orchestration" not in p.parts]
    assert offenders(core, from_package("control.orchestration")) == []


def test_the_console_reaches_the_control_plane_only_through_the_client():
    # The console (ringfence_server/console) has no authority of its own: it talks to the control
    # plane over the public API with the signed-in person's token. Of the server it may import only
    # the pure span-tree rendering of control.tracing (a run's trace rebuilt from its events) and
    # control.netloc (which hosts are loopback, as for serve's listeners), never the store, the
    # orchestration or anything else that holds state or power.
    console = list(modules("console"))
    assert console, "the console's sources moved: update this rule"

    def forbidden(name: str) -> bool:
        if name == S or not name.startswith(f"{S}."):
            return False
        return not from_package("console", "control.tracing", "control.netloc")(name)

    assert offenders(console, forbidden) == []


# What a worker may use of the control plane: pure canonicalization, nothing that holds state,
# secrets or authority (the store, policy, approvals, tenants' tokens, orchestration, the API).
WORKER_MAY_IMPORT_OF_CONTROL = ("control.validation",)


def test_the_worker_imports_nothing_of_the_control_plane_but_canonicalization():
    worker = list(modules("worker"))
    assert worker, "the worker's sources moved: update this rule"
    allowed = from_package(*WORKER_MAY_IMPORT_OF_CONTROL)

    def forbidden(name: str) -> bool:
        return from_package("control")(name) and not allowed(name)

    assert offenders(worker, forbidden) == []
    assert offenders(worker, from_package("console")) == []


def test_the_sandbox_imports_nothing_of_the_worker():
    assert offenders(modules("sandbox"), from_package("worker")) == []


def test_the_worker_rule_sees_a_violation(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from ringfence_server.control.store import open_store\n"
                   "from ringfence_server.control.validation import canonical_json\n")
    names = imports_of(bad)
    allowed = from_package(*WORKER_MAY_IMPORT_OF_CONTROL)
    assert sorted(n for n in names if from_package("control")(n) and not allowed(n)) == [
        "ringfence_server.control.store", "ringfence_server.control.store.open_store"]


def test_the_checker_sees_a_violation(tmp_path):
    # The rule checker itself must turn red on a violating file.
    bad = tmp_path / "bad.py"
    bad.write_text("from ringfence_server.control import policy\nimport ringfence_server.control.orchestration\n")
    names = imports_of(bad)
    assert {"ringfence_server.control.policy", "ringfence_server.control.orchestration"} <= names


def test_the_checker_sees_a_runtime_importing_its_users(tmp_path):
    # An import inside a function counts as much as one at the top.
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from ringfence_server.imagebuild import builder\n"
                   "    import ringfence_server.demo_services.ledger\n")
    names = sorted(n for n in imports_of(bad) if from_package(*SANDBOX_USERS)(n))
    assert names == ["ringfence_server.demo_services.ledger", "ringfence_server.imagebuild",
                     "ringfence_server.imagebuild.builder"]
    assert not from_package("imagebuild")("ringfence_server.imagebuilder")
