"""Tool packages (ringfence_server.control.toolpkg): the loader the server uses, `tools new`, and the checks of
`tools check`, with no engine (the sandbox steps against a FakeBackend, and the in-sandbox
script run here against folders standing in for the image's). The real engine, image builds
and the server are in tests/e2e/test_own_tools.py."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ringfence.cli import main as cli
from ringfence.cli.main import build
from ringfence.errors import ConfigError
from ringfence_server.control.config import TOOL_LIMIT_CAPS, ToolsConfig, load_config
from ringfence_server.control.registry import _LIMIT_KEYS, _MANIFEST_KEYS, _RECONCILE_KEYS
from ringfence_server.control.toolpkg.check import SCRIPT, Checker, Images, builtin_tools, stage_package, targets
from ringfence_server.control.toolpkg.packages import load_all, load_package, package_folders, registry_from_config
from ringfence_server.imagebuild.spec import load_spec
from ringfence_server.sandbox.fake import FakeBackend, ok_result
from ringfence_server.sandbox.pinned_images import IMAGES_DIR, Lock, LockEntry, builtin_lock
from ringfence_server.sandbox.result import Outcome, SandboxResult

ROOT = Path(__file__).resolve().parents[2]
BUILTIN_TOOLS = ROOT / "ringfence_server" / "control" / "tools"
RUNNER_DIR = IMAGES_DIR / "tool" / "rootfs" / "opt" / "ringfence"


def manifest(name="probe", **over):
    doc = {"name": name, "description": "a probe", "mutates": False, "reversible": True, "cost": 0.01,
           "schema": {"type": "object", "properties": {"text": {"type": "string"}}}, "image": "probe"}
    doc.update(over)
    return {k: v for k, v in doc.items() if v is not None}


def package(root: Path, name="probe", doc=None, *, code="def run(arguments, context):\n    return arguments\n",
            tests=True) -> Path:
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "manifest.json").write_text(json.dumps(doc if doc is not None else manifest(name)))
    if code is not None:
        (folder / f"{name}.py").write_text(code)
    if tests:
        (folder / f"test_{name}.py").write_text("import unittest\n")
    return folder


def config_with(tmp_path: Path, text: str):
    path = tmp_path / "ringfence.toml"
    path.write_text(text)
    return load_config(path)


# -- the loader ---------------------------------------------------------------------------------


def test_packages_are_sub_folders_with_a_manifest_or_the_folder_itself(tmp_path):
    tools = tmp_path / "tools"
    package(tools, "alpha")
    package(tools, "beta")
    (tools / "notes").mkdir()
    (tools / ".hidden").mkdir()
    (tools / ".hidden" / "manifest.json").write_text("{}")
    assert [p.name for p in package_folders(tools)] == ["alpha", "beta"]
    assert package_folders(tools / "alpha") == [tools / "alpha"]
    assert package_folders(tmp_path / "absent") == []


def test_the_server_loads_the_built_in_tools_and_the_configured_packages(tmp_path):
    package(tmp_path / "tools", "probe")
    config = config_with(tmp_path, '[tools]\npackages = ["tools"]\n')
    assert config.tools.packages == (tmp_path / "tools",)
    loaded = {p.name: p for p in load_all(config)}
    assert loaded["probe"].folder == tmp_path / "tools/probe"
    assert loaded["probe"].code == tmp_path / "tools/probe/probe.py"
    # The built-in tools are one package of the same loader, in their flat layout.
    assert loaded["echo"].folder is None and loaded["echo"].source == BUILTIN_TOOLS / "echo.json"
    registry = registry_from_config(config)
    assert "probe" in registry and "echo" in registry and registry.get("probe").image == "probe"
    assert len(registry) == len(list(BUILTIN_TOOLS.glob("*.json"))) + 1


def test_a_name_defined_twice_names_both_places(tmp_path):
    package(tmp_path / "a", "probe")
    package(tmp_path / "b", "probe")
    config = config_with(tmp_path, '[tools]\npackages = ["a", "b"]\n')
    with pytest.raises(ConfigError) as e:
        load_all(config)
    assert e.value.key == "tools.probe"
    assert str(tmp_path / "a/probe/manifest.json") in str(e.value) and str(tmp_path / "b/probe/manifest.json") in str(
        e.value)
    # A package may not take a built-in tool's name either.
    package(tmp_path / "c", "echo")
    with pytest.raises(ConfigError, match=re.escape(str(BUILTIN_TOOLS / "echo.json")) + ".*"
                       + re.escape(str(tmp_path / "c/echo/manifest.json"))):
        load_all(config_with(tmp_path, '[tools]\npackages = ["c"]\n'))


@pytest.mark.parametrize("setup, key, message", [
    (lambda root: package(root, "probe", manifest("other")), "name", "named after its tool"),
    (lambda root: package(root, "probe", manifest(cost=None)), "cost", "required in a package"),
    (lambda root: package(root, "probe", code=None), "", "has no probe.py"),
    (lambda root: package(root, "probe", manifest(mutates=None)), "mutates", "is required"),
    (lambda root: package(root, "probe", manifest(schema={"type": "object", "properties": {"n": {"type": 3}}})),
     "schema", "invalid JSON Schema"),
    (lambda root: package(root, "probe", manifest(limits={"timeout_s": 600})), "limits.timeout_s",
     "over the server's cap 300 \\(tools.max_timeout_s\\)"),
])
def test_a_bad_package_stops_the_server_naming_the_file_and_key(tmp_path, setup, key, message):
    folder = setup(tmp_path)
    with pytest.raises(ConfigError, match=message) as e:
        load_package(folder)
    assert e.value.key.endswith(f"manifest.json:{key}") if key else e.value.key == str(folder)


def test_the_caps_apply_to_the_built_in_tools_too(tmp_path):
    # run_tests asks for 120 s: a deployment that caps tools at 60 s refuses to start with it.
    with pytest.raises(ConfigError, match="120 is over the server's cap 60") as e:
        load_all(config_with(tmp_path, "[tools]\nmax_timeout_s = 60\n"))
    assert e.value.key == f"{BUILTIN_TOOLS / 'run_tests.json'}:limits.timeout_s"


@pytest.mark.parametrize("text, key", [
    ('[tools]\npackages = ["absent"]\n', "tools.packages[0]"),
    ("[tools]\npackages = \"tools\"\n", "tools.packages"),
    ("[tools]\nmax_cpus = 4\n", "tools.max_cpus"),
    ("[tools]\nmax_memory_bytes = 0\n", "tools.max_memory_bytes"),
    ("[tools]\nmax_pids = 1.5\n", "tools.max_pids"),
    ("[tools]\nfolders = []\n", "tools.folders"),
])
def test_tools_config_errors_name_the_key(tmp_path, text, key):
    with pytest.raises(ConfigError) as e:
        config_with(tmp_path, text)
    assert e.value.key == key


def test_the_default_caps_are_documented_and_admit_every_built_in_tool():
    caps = ToolsConfig()
    assert set(caps.caps()) == set(TOOL_LIMIT_CAPS) == _LIMIT_KEYS
    default = load_config()
    assert default.tools == caps
    assert len(load_all(default)) == len(list(BUILTIN_TOOLS.glob("*.json")))


def test_serve_refuses_a_bad_package_before_touching_the_engine(tmp_path, capsys):
    package(tmp_path / "tools", "probe", manifest(limits={"memory_bytes": 4 * 1024**3}))
    (tmp_path / "ringfence.toml").write_text('[tools]\npackages = ["tools"]\n')
    assert cli.main(["serve", "--config", str(tmp_path / "ringfence.toml"), "--state-dir", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err
    assert "limits.memory_bytes" in err and "over the server's cap" in err and "probe/manifest.json" in err


# -- tools new -----------------------------------------------------------------------------------


def test_tools_new_scaffolds_a_working_package_and_its_image(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["tools", "new", "word_count"]) == 0
    out = capsys.readouterr().out
    pkg, spec_dir = tmp_path / "tools/word_count", tmp_path / "images/word-count"
    for f in ("manifest.json", "word_count.py", "test_word_count.py"):
        assert f"created {Path('tools/word_count') / f}" in out
    assert "ringfence images build --images-dir images --update-lock" in out
    assert 'packages = ["tools"]' in out and "[[policy.rules]]" in out
    # The manifest is one the server loads; the image lays the package's code.
    loaded = load_package(pkg)
    assert (loaded.manifest.image, loaded.manifest.mutates, loaded.manifest.cost) == ("word-count", False, 0.01)
    spec = load_spec(spec_dir)
    assert spec.parent == "tool" and spec.tools == ("../../tools/word_count",)
    assert spec.lays_tool("word_count") == pkg / "word_count.py"
    # Its tests pass, with ringfence_tool on the path as in the sandbox.
    run = subprocess.run([sys.executable, "-B", "-m", "unittest", "discover", "-s", str(pkg), "-t", str(pkg), "-v"],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(RUNNER_DIR)})
    assert run.returncode == 0 and "Ran 2 tests" in run.stderr, run.stderr


@pytest.mark.parametrize("argv, message", [
    (["Bad"], "is not a tool name"),
    (["a" * 65], "is not a tool name"),
    (["echo"], "echo is a built-in tool"),
    (["ledger"], "ledger is a built-in image"),
    (["probe", "--image", "Bad_Image"], "is not an image name"),
])
def test_tools_new_refuses_and_writes_nothing(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["tools", "new", *argv]) == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_tools_new_refuses_an_existing_package_or_image(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["tools", "new", "probe"]) == 0
    assert cli.main(["tools", "new", "probe"]) == 2
    assert "tools/probe exists" in capsys.readouterr().err
    assert cli.main(["tools", "new", "probe_two", "--image", "probe"]) == 2
    assert "images/probe exists" in capsys.readouterr().err
    assert not (tmp_path / "tools/probe_two").exists()


def test_tools_new_and_check_are_routed_past_the_tools_listing():
    route = build()[1].route  # the server's extension registers `tools new|check`
    assert route(["tools", "new", "x"]) == ["tools new", "x"]
    assert route(["tools", "check", "d", "--json"]) == ["tools check", "d", "--json"]
    assert route(["tools", "credit", "--json"]) == ["tools", "credit", "--json"]
    assert route(["tools", "--", "new"]) == ["tools", "--", "new"]
    assert route(["tools"]) == ["tools"]


# -- tools check -------------------------------------------------------------------------------


def user_images(tmp_path: Path, specs: dict[str, dict], pinned: tuple[str, ...] = ()) -> Path:
    """A user's images dir with these specs; `pinned` ones in its lock (children of the
    built-in tool, their inputs as they are now)."""
    images = tmp_path / "images"
    for name, doc in specs.items():
        (images / name).mkdir(parents=True, exist_ok=True)
        (images / name / "image.json").write_text(json.dumps(doc))
    builtin = builtin_lock()
    assert builtin is not None, "the built-in images have a lock"
    entries = [LockEntry(name, "sha256:" + hashlib.sha256(name.encode()).hexdigest(),
                         load_spec(images / name).inputs_sha256(), "tool", builtin.image_id("tool"))
               for name in pinned]
    Lock(tuple(entries), images / "images.lock", builtin).write(images / "images.lock")
    return images


def checker(images: Path | None, backend=None, caps=None, **kw) -> Checker:
    return Checker(caps=caps or ToolsConfig(), caps_from="the embedded defaults", images=Images(images),
                   backend=(lambda: backend) if backend is not None else None,
                   builtin=builtin_tools(BUILTIN_TOOLS), **kw)


def lines(report) -> dict[str, str]:
    return {c.name: str(c) for c in report.checks}


def sandbox_answering(code: Path | None, tests: dict | None, *, outcome=Outcome.OK, stderr=b""):
    digest = hashlib.sha256(code.read_bytes()).hexdigest() if code is not None else None

    def handler(request):
        doc = {"code_sha256": digest, **({"tests": tests} if tests is not None else {})}
        return SandboxResult(outcome=outcome, exit_code=0, stdout=(json.dumps(doc) + "\n").encode(), stderr=stderr,
                             stdout_truncated=False, stderr_truncated=False, duration_ms=5,
                             image_id="sha256:" + "ab" * 32, runtime=request.profile.runtime)

    return FakeBackend(handler)


PASSED = {"ran": 2, "failures": [], "errors": [], "skipped": 0, "unexpected_successes": 0, "seconds": 0.01}


def test_a_ready_package_passes_every_check_and_its_tests_run_in_its_image(tmp_path):
    pkg = package(tmp_path / "tools", "probe")
    images = user_images(tmp_path, {"probe": {"parent": "tool", "tools": ["../../tools/probe"]}}, pinned=("probe",))
    backend = sandbox_answering(pkg / "probe.py", PASSED)
    report = checker(images, backend).check(targets(pkg)[0])
    assert report.ok, [str(c) for c in report.checks]
    assert [c.name for c in report.checks] == ["files", "schema", "risk", "limits", "manifest", "image", "code",
                                               "tests"]
    assert "2 tests passed" in lines(report)["tests"] and "no network" in lines(report)["tests"]
    (request,) = backend.requests
    assert request.argv[:5] == ("python3", "-I", "-S", "-B", "-c") and request.argv[-1] == "probe"
    assert request.profile.image == "probe" and request.warm is False and request.profile.egress is None
    (mount,) = request.profile.inputs
    assert mount.container_path == "/package" and mount.host_path != str(pkg)  # a staged copy, now gone
    assert not Path(mount.host_path).exists()


def test_a_bad_schema_and_limits_over_the_caps_are_named_and_nothing_runs(tmp_path):
    doc = manifest(schema={"type": "object", "properties": {"n": {"type": "integer", "minimum": "zero"}}},
                   limits={"timeout_s": 600, "memory_bytes": 2 * 1024**3, "cpus": 0.5})
    pkg = package(tmp_path / "tools", "probe", doc)
    images = user_images(tmp_path, {"probe": {"parent": "tool", "tools": ["../../tools/probe"]}}, pinned=("probe",))
    backend = sandbox_answering(pkg / "probe.py", PASSED)
    report = checker(images, backend).check(targets(pkg)[0])
    got = lines(report)
    assert not report.ok and report.failed == ["schema", "limits", "code", "tests"]
    assert got["schema"] == ("schema: FAILED: not a valid JSON Schema (draft 2020-12): "
                             "schema.properties.n.minimum: 'zero' is not of type 'number'")
    assert "limits.memory_bytes 2.14748e+09 is over the server's cap 1.07374e+09 (tools.max_memory_bytes)" in got[
        "limits"]
    assert "limits.timeout_s 600 is over the server's cap 300 (tools.max_timeout_s) in the embedded defaults" in got[
        "limits"]
    assert got["manifest"].startswith("manifest: ok: the other fields are valid")
    assert got["tests"] == "tests: FAILED: not run: fix the problems above first"
    assert backend.requests == []


@pytest.mark.parametrize("doc, check, message", [
    (manifest(cost=None), "risk", "cost must be stated"),
    (manifest(reversible="yes"), "risk", "reversible must be stated, true or false"),
    (manifest(limits={"disk": 1}), "limits", "limits.disk is not a limit"),
    (manifest(limits={"cpus": 3}), "limits", "limits.cpus 3 is outside the sandbox's range [0.01, 2]"),
    (manifest(egress=["x"]), "manifest", "egress: unknown key"),
    (manifest(egress_hosts=["10.0.0.1"]), "manifest", "egress_hosts"),
    (manifest(schema={"type": "array"}), "schema", '"type": "object"'),
    (manifest(schema=None), "schema", "schema is missing"),
])
def test_each_problem_is_named_by_its_check(tmp_path, doc, check, message):
    pkg = package(tmp_path / "tools", "probe", doc)
    report = checker(None).check(targets(pkg)[0])
    failed = lines(report)[check]
    assert failed.startswith(f"{check}: FAILED") and message in failed


def test_files_a_built_in_name_and_an_unpinned_image(tmp_path):
    pkg = package(tmp_path / "tools", "probe", tests=False)
    report = checker(None).check(targets(pkg)[0])
    assert "test_probe.py is missing" in lines(report)["files"]
    assert "no image 'probe'" in lines(report)["image"]
    echo = package(tmp_path / "tools", "echo", manifest("echo"))
    assert "is a built-in tool's" in lines(checker(None).check(targets(echo)[0]))["manifest"]
    images = user_images(tmp_path, {"probe": {"parent": "tool", "tools": ["../../tools/probe"]}})
    assert f"images/probe has a spec but is not pinned yet: run `ringfence images build --images-dir {images} " \
           "--update-lock`" in lines(checker(images).check(targets(pkg)[0]))["image"]


def test_code_an_image_that_does_not_lay_it_or_was_changed_since_pinned(tmp_path):
    pkg = package(tmp_path / "tools", "probe")
    images = user_images(tmp_path, {"probe": {"parent": "tool"}}, pinned=("probe",))
    got = lines(checker(images).check(targets(pkg)[0]))["code"]
    assert 'lay no /opt/ringfence/tools/probe.py: add "tools": ["../../tools/probe"] to images/probe/image.json' in got
    pkg = package(tmp_path / "b/tools", "probe")
    images = user_images(tmp_path / "b", {"probe": {"parent": "tool", "tools": ["../../tools/probe"]}},
                         pinned=("probe",))
    (pkg / "probe.py").write_text("def run(arguments, context):\n    return 2\n")  # after the pin
    got = lines(checker(images).check(targets(pkg)[0]))["code"]
    assert "images/probe changed since" in got and "(a tool's code is among its inputs)" in got


def test_code_and_tests_as_the_sandbox_reports_them(tmp_path):
    pkg = package(tmp_path / "tools", "probe")
    images = user_images(tmp_path, {"probe": {"parent": "tool", "tools": ["../../tools/probe"]}}, pinned=("probe",))
    other = tmp_path / "other.py"
    other.write_text("# not the package's code\n")
    failing = {**PASSED, "failures": ["test_probe.ProbeTest.test_one"]}
    for backend, check, message in [
        (sandbox_answering(other, PASSED), "code", "in the pinned image is not"),
        (sandbox_answering(None, PASSED), "code", "the pinned image has no /opt/ringfence/tools/probe.py"),
        (sandbox_answering(pkg / "probe.py", failing, stderr=b"FAIL: test_one\nAssertionError\n"), "tests",
         "1 of 2 failed: test_probe.ProbeTest.test_one"),
        (sandbox_answering(pkg / "probe.py", {**PASSED, "ran": 0}), "tests", "no test ran"),
        (sandbox_answering(pkg / "probe.py", None, outcome=Outcome.TIMEOUT), "tests", "timeout after 120s"),
    ]:
        report = checker(images, backend).check(targets(pkg)[0])
        got = lines(report)[check]
        assert got.startswith(f"{check}: FAILED") and message in got, got
    got = lines(checker(images, sandbox_answering(pkg / "probe.py", failing, stderr=b"FAIL: test_one\n"))
                .check(targets(pkg)[0]))["tests"]
    assert "        | FAIL: test_one" in got  # the output's tail


def test_the_built_in_tools_check_as_one_package_their_code_found_in_the_tool_image():
    def handler(request):
        name = request.argv[-1]
        digest = hashlib.sha256((RUNNER_DIR / "tools" / f"{name}.py").read_bytes()).hexdigest()
        return ok_result(json.dumps({"code_sha256": digest}).encode())

    backend = FakeBackend(handler)
    found = targets(BUILTIN_TOOLS)
    assert len(found) == len(list(BUILTIN_TOOLS.glob("*.json"))) and all(t.folder is None for t in found)
    c = checker(None, backend)
    for target in found:
        report = c.check(target)
        assert report.ok, [str(x) for x in report.checks]
        assert "its tests are the repository's" in lines(report)["tests"]
    assert all(r.profile.image == "tool" and r.profile.inputs == () for r in backend.requests)


def test_tools_check_cli_exit_codes_and_json(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    package(tmp_path / "tools", "probe", manifest(schema={"type": "object", "required": "text"},
                                                 limits={"timeout_s": 600}))
    assert cli.main(["tools", "check", "tools"]) == 1
    out = capsys.readouterr().out
    assert "tools/probe: probe" in out
    assert "    schema: FAILED: not a valid JSON Schema (draft 2020-12): schema.required: 'text' is not of type " \
           "'array'" in out
    assert "    limits: FAILED: limits.timeout_s 600 is over the server's cap 300" in out
    assert out.rstrip().endswith("tools check: 1 of 1 failed: probe (schema, limits, image, code, tests)")
    # The config's caps: a deployment that allows 900 s admits the limit.
    (tmp_path / "ringfence.toml").write_text("[tools]\nmax_timeout_s = 900\n")
    assert cli.main(["tools", "check", "tools", "--config", "ringfence.toml", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    (pkg,) = doc["packages"]
    assert doc["ok"] is False and pkg["name"] == "probe"
    assert {c["check"]: c["ok"] for c in pkg["checks"]}["limits"] is True
    assert "within the caps of ringfence.toml" in next(c for c in pkg["checks"] if c["check"] == "limits")["detail"]
    assert cli.main(["tools", "check", "nowhere"]) == 2
    assert "no tool package" in capsys.readouterr().err


# -- what runs in the sandbox, run here against stand-in folders ---------------------------------


def test_the_sandbox_script_hashes_the_code_and_runs_the_packages_tests(tmp_path):
    """SCRIPT with the image's folders pointed at stand-ins: the runner's ringfence_tool, the
    tool's code in tools/, the package's tests (one passing, one failing, one printing to stdout,
    which must not spoil the report)."""
    opt = tmp_path / "opt"
    (opt / "tools").mkdir(parents=True)
    (opt / "ringfence_tool.py").write_text((RUNNER_DIR / "ringfence_tool.py").read_text())
    code = "from ringfence_tool import ToolError\n\ndef run(arguments, context):\n    return arguments\n"
    (opt / "tools" / "probe.py").write_text(code)
    pkg = package(tmp_path / "src", "probe", code=code, tests=False)
    (pkg / "test_probe.py").write_text(
        "import unittest\n\nimport probe\nfrom ringfence_tool import ToolError\n\n\n"
        "class T(unittest.TestCase):\n"
        "    def test_ok(self):\n        print('noise on stdout')\n        self.assertEqual(probe.run({'a': 1}, {}), "
        "{'a': 1})\n\n"
        "    def test_bad(self):\n        self.assertEqual(ToolError('invalid', 'x').cls, 'fatal')\n")
    staged = stage_package(pkg, tmp_path / "staged")
    assert sorted(p.name for p in staged.iterdir()) == ["manifest.json", "probe.py", "test_probe.py"]
    assert staged.stat().st_mode & 0o777 == 0o755
    script = SCRIPT.replace("/opt/ringfence/tools/", f"{opt}/tools/").replace('"/opt/ringfence"', f'"{opt}"')
    script = script.replace('"/package"', f'"{staged}"')
    run = subprocess.run([sys.executable, "-I", "-S", "-B", "-c", script, "probe"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    (line,) = run.stdout.splitlines()
    doc = json.loads(line)
    assert doc["code_sha256"] == hashlib.sha256(code.encode()).hexdigest()
    assert doc["tests"]["ran"] == 2 and doc["tests"]["failures"] == ["test_probe.T.test_bad"]
    assert "noise on stdout" in run.stderr and "test_bad" in run.stderr


def test_stage_package_refuses_links(tmp_path):
    pkg = package(tmp_path / "src", "probe")
    (pkg / "link.py").symlink_to("/etc/passwd")
    with pytest.raises(OSError, match="not a regular file"):
        stage_package(pkg, tmp_path / "staged")


# -- the reference -----------------------------------------------------------------------------


def test_docs_tools_md_names_every_manifest_field_limit_and_tool_api_name():
    text = (ROOT / "docs" / "TOOLS.md").read_text()
    for key in sorted(_MANIFEST_KEYS | _LIMIT_KEYS | _RECONCILE_KEYS):
        assert f"`{key}`" in text, key
    for name in ("ToolError", "CLASSES", "http_request", "http_json", "has_egress", "load_tool", "Reply",
                 "MAX_REPLY", "call_id", "idempotency_key"):
        assert name in text, name
    for cls in ("invalid", "transient", "rate_limited", "fatal"):
        assert f'`"{cls}"`' in text, cls
    for cap in ToolsConfig().caps():
        assert f"`max_{cap}`" in text, cap
    assert "docs/TOOLS.md" in (ROOT / "README.md").read_text()
