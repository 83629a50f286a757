"""The import rules of docs/ARCHITECTURE.md, checked on the source: the architecture as a graph.

- sandbox imports nothing from control: an executor that knows policy can be talked into
  permitting itself;
- neither do the packages beside it that use the sandbox (imagebuild, the image toolchain;
  conformance, the `ringfence conformance` suite; demo_services, the demo services);
- sandbox imports nothing from those three but the lock it runs by, which it owns
  (sandbox.pinned_images): running a call never loads the image builder, the suite or a demo;
- control.registry never imports control.policy: a tool must not describe itself as permitted;
- generated protobuf modules are imported only at the edge (control.api, the CLI, the demo);
- control.orchestration is imported by nothing but the edge (and itself).
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


def modules(package: str):
    for path in sorted((ROOT / package).rglob("*.py")):
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
    rel = path.relative_to(ROOT).as_posix()
    # control/client/ is the client SDK: an edge too (the servicer, the client, the CLI).
    # control/demo/ runs a server in-process and drives it as a user would: an edge as well.
    return rel.startswith(("control/api/", "control/client/", "control/demo/")) or rel == "control/cli.py"


def test_sandbox_imports_nothing_from_control():
    assert offenders(modules("sandbox"), lambda n: n == "control" or n.startswith("control.")) == []


# The packages that use the sandbox runtime from beside it, never the other way round.
SANDBOX_USERS = ("imagebuild", "conformance", "demo_services")


def from_package(*packages: str):
    """A predicate: does an imported name belong to one of `packages`?"""
    return lambda name: any(name == p or name.startswith(f"{p}.") for p in packages)


def test_the_sandbox_users_import_nothing_from_control():
    for package in SANDBOX_USERS:
        assert offenders(modules(package), from_package("control")) == [], package


def test_sandbox_imports_nothing_from_its_users():
    # The lock it runs by is sandbox.pinned_images, its own: imagebuild imports it from there.
    assert offenders(modules("sandbox"), from_package(*SANDBOX_USERS)) == []


def test_registry_never_imports_policy():
    registry = [p for p in modules("control") if p.stem == "registry" or "registry" in p.parts]
    assert offenders(registry, lambda n: "policy" in n.split(".")) == []


def test_generated_protos_only_at_the_edge():
    core = [p for p in modules("control") if not is_edge(p)]
    assert offenders(core, lambda n: n.startswith("control.api") or n.endswith("_pb2") or n.endswith("_pb2_grpc")) == []


def test_only_the_edge_depends_on_orchestration():
    core = [p for p in modules("control") if not is_edge(p) and "orchestration" not in p.parts]
    assert offenders(core, lambda n: n == "control.orchestration" or n.startswith("control.orchestration.")) == []


def test_the_checker_sees_a_violation(tmp_path):
    # The rule checker itself must turn red on a violating file.
    bad = tmp_path / "bad.py"
    bad.write_text("from control import policy\nimport control.orchestration\n")
    names = imports_of(bad)
    assert {"control.policy", "control.orchestration"} <= names


def test_the_checker_sees_a_runtime_importing_its_users(tmp_path):
    # An import inside a function counts as much as one at the top.
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from imagebuild import builder\n    import demo_services.ledger\n")
    names = sorted(n for n in imports_of(bad) if from_package(*SANDBOX_USERS)(n))
    assert names == ["demo_services.ledger", "imagebuild", "imagebuild.builder"]
    assert not from_package("imagebuild")("imagebuilder")
