"""`ringfence tools check DIR...`: is this tool package ready to serve? One line per check.

DIR is a package folder, a folder of packages, or a folder of flat built-in manifests
(ringfence_server/control/tools/). For each package, in order:

    files     manifest.json is a JSON object; <name>.py and test_<name>.py are regular files; the
              folder is named after the tool. (A built-in manifest: its code is found in the
              image spec that lays it.)
    schema    "schema" is a JSON Schema of "type": "object" (jsonschema's check_schema, draft
              2020-12), every problem named by its path.
    risk      mutates, reversible (true/false) and cost (a number >= 0) are all stated.
    limits    every limit is known, within the sandbox's ranges and at most the server's cap
              (`[tools] max_*` of --config, else the embedded defaults), each one over named.
    manifest  every other field (name, description, paths, egress hosts, runtime, image,
              reconcile, workspace, outputs), as the server parses it; and the name is not a
              built-in tool's (the server would refuse the second definition).
    image     the image the manifest names is pinned: the images dir's lock (--images-dir, else
              the config's `[images] dir`) over the built-in one.
    code      the image holds this package's code: its spec (or a parent's) lays the file at
              /opt/ringfence/tools/<name>.py (`"tools"` in image.json), the specs are unchanged
              since the lock pinned them (the code is among their inputs), and, in the sandbox,
              the file in the pinned image hashes as the package's <name>.py does.
    tests     the package's tests, run in the sandbox: the package folder copied (regular files
              only) and mounted read-only at /package, `python3 -I -S -B` running unittest
              discovery (test_*.py, top level /package) in the tool's pinned image with
              /opt/ringfence first on sys.path (ringfence_tool) and /opt/ringfence/site after the
              standard library (the image's wheels), as the runner has them. The container is the
              one every call gets (uid 10001, read-only root, no network: tests that need a
              receiver fake it), with the tool's runtime, its limits raised to at least 256 MiB,
              1 CPU and 64 pids, and --timeout seconds (default 120). Passing means at least one
              test ran and none failed or errored. Built-in manifests have no package tests
              (theirs are the repository's): reported and not run.

The sandbox runs (code and tests share one container) only once the checks before them pass.
Exit status: 0 every check of every package passed, 1 one failed, 2 bad usage (no package
found, a bad config). `--json` prints one JSON document for CI instead of the lines.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from ringfence.errors import ConfigError
from ringfence_server.control.config import ToolsConfig
from ringfence_server.control.registry import ToolLimits, ToolManifest, parse_manifest
from ringfence_server.control.toolpkg.packages import MANIFEST, limit_problems, package_folders, read_manifest
from ringfence_server.imagebuild.spec import TOOLS_PATH, ImageSpec, ancestors, load_specs
from ringfence_server.sandbox.backend import SandboxBackend, SandboxRequest
from ringfence_server.sandbox.errors import ImageError, SandboxError
from ringfence_server.sandbox.pinned_images import IMAGES_DIR, Lock, LockEntry, is_builtin, lock_for
from ringfence_server.sandbox.profile import LIMIT_RANGES, InputMount, KiB, MiB, SandboxProfile
from ringfence_server.sandbox.result import Outcome

CHECKS = ("files", "schema", "risk", "limits", "manifest", "image", "code", "tests")
PACKAGE_MOUNT = "/package"
DEFAULT_TIMEOUT_S = 120.0
_RANGES = LIMIT_RANGES  # the sandbox's own (ringfence_server.sandbox.profile.SandboxProfile)

# Runs in the tool's image (python3 -I -S -B -c SCRIPT NAME): the code's hash, then the tests.
# Its one report line goes to a private copy of fd 1; fd 1 itself then points at stderr, so
# nothing a test prints can corrupt the report.
SCRIPT = r"""
import hashlib, json, os, sys, time, unittest
name = sys.argv[1]
out = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
sys.stdout = sys.stderr
sys.path.insert(0, "/opt/ringfence")
if os.path.isdir("/opt/ringfence/site"):
    sys.path.append("/opt/ringfence/site")
report = {"code_sha256": None}
try:
    with open("/opt/ringfence/tools/" + name + ".py", "rb") as f:
        report["code_sha256"] = hashlib.sha256(f.read()).hexdigest()
except OSError:
    pass
if os.path.isdir("/package"):
    t0 = time.monotonic()
    suite = unittest.defaultTestLoader.discover("/package", pattern="test_*.py", top_level_dir="/package")
    result = unittest.TextTestRunner(stream=sys.stderr, verbosity=2).run(suite)
    report["tests"] = {
        "ran": result.testsRun, "failures": [t.id() for t, _ in result.failures],
        "errors": [t.id() for t, _ in result.errors], "skipped": len(result.skipped),
        "unexpected_successes": len(result.unexpectedSuccesses), "seconds": round(time.monotonic() - t0, 3),
    }
out.write(json.dumps(report) + "\n")
out.flush()
"""


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str

    def __str__(self) -> str:
        return f"{self.name}: {'ok' if self.ok else 'FAILED'}: {self.detail}"


@dataclass
class Report:
    """The checks of one package (of one manifest, for the built-in layout)."""

    path: Path
    name: str | None = None
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    @property
    def failed(self) -> list[str]:
        return [c.name for c in self.checks if not c.ok]

    def add(self, name: str, ok: bool, detail: str) -> bool:
        self.checks.append(Check(name, ok, detail))
        return ok

    def to_json(self) -> dict[str, Any]:
        return {"path": str(self.path), "name": self.name, "ok": self.ok,
                "checks": [{"check": c.name, "ok": c.ok, "detail": c.detail} for c in self.checks]}


@dataclass(frozen=True)
class Target:
    """What one report checks: a package folder, or one flat built-in manifest."""

    manifest: Path
    folder: Path | None  # None: a built-in manifest

    @property
    def label(self) -> Path:
        return self.folder if self.folder is not None else self.manifest


def targets(directory: Path) -> list[Target]:
    """The packages of DIR (see the module docstring); [] when there is none."""
    directory = Path(directory)
    folders = package_folders(directory)
    if folders:
        return [Target(f / MANIFEST, f) for f in folders]
    if directory.is_dir():
        from ringfence_server.control.tools import manifest_files

        return [Target(p, None) for p in manifest_files(directory)]
    return []


class Images:
    """The images a tool may name: the user's dir (its specs and lock) over the built-in ones."""

    def __init__(self, images_dir: Path | None) -> None:
        builtin = load_specs(IMAGES_DIR)
        self.directory = None if images_dir is None or is_builtin(images_dir) else Path(images_dir)
        if self.directory is None:
            self.own, self.inherited = builtin, {}
        else:
            self.own, self.inherited = load_specs(self.directory, builtin), builtin
        self.lock: Lock = lock_for(self.directory, missing_ok=True)

    @property
    def where(self) -> str:
        return str(self.lock.path) if self.lock.path is not None else "images.lock"

    def build_hint(self) -> str:
        return ("ringfence images build --update-lock" if self.directory is None
                else f"ringfence images build --images-dir {self.directory} --update-lock")

    def spec(self, name: str) -> tuple[ImageSpec, bool] | None:
        if name in self.own:
            return self.own[name], self.directory is not None
        if name in self.inherited:
            return self.inherited[name], False
        return None

    def chain(self, name: str) -> list[tuple[ImageSpec, bool]]:
        """The image's spec and its parents, each with whether it is the user's (True)."""
        found = self.spec(name)
        if found is None:
            return []
        spec, own = found
        return [(spec, own), *ancestors(spec, self.own, self.inherited)]

    def entry(self, name: str, own: bool) -> LockEntry | None:
        if own or self.lock.inherited is None:
            return self.lock.get(name)
        return self.lock.inherited.get(name)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _rel(path: Path) -> str:
    """`path` relative to the working folder when it is under it, else absolute."""
    rel = os.path.relpath(path)
    return str(Path(path).resolve()) if rel.startswith("..") else rel


class Checker:
    """Runs the checks; `backend` None: the sandbox checks are reported as not run."""

    def __init__(self, *, caps: ToolsConfig, caps_from: str, images: Images,
                 backend: Callable[[], SandboxBackend] | None, builtin: Mapping[str, Path],
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.caps, self.caps_from, self.images = caps, caps_from, images
        self._backend_factory = backend
        self._backend: SandboxBackend | None = None
        self._backend_error: str | None = None
        self.builtin = builtin  # built-in tool name -> its manifest (a package may not reuse one)
        self.timeout_s = timeout_s

    def backend(self) -> SandboxBackend | None:
        if self._backend is None and self._backend_error is None and self._backend_factory is not None:
            try:
                self._backend = self._backend_factory()
            except SandboxError as e:
                self._backend_error = str(e)
        return self._backend

    def close(self) -> None:
        if self._backend is not None:
            self._backend.close()

    # -- one package ---------------------------------------------------------------------

    def check(self, target: Target) -> Report:
        report = Report(target.label)
        doc = self._files(target, report)
        if doc is None:
            for name in CHECKS[1:]:
                report.add(name, False, "not checked: no manifest to read")
            return report
        schema_ok = self._schema(doc, report)
        risk_ok = self._risk(doc, report)
        limits_ok = self._limits(doc, report)
        manifest = self._manifest(doc, target, report, schema_ok=schema_ok, risk_ok=risk_ok, limits_ok=limits_ok)
        if manifest is None:
            for name in ("image", "code", "tests"):
                report.add(name, False, "not checked: the manifest does not parse")
            return report
        image_ok = self._image(manifest, report)
        code = self._code_file(target, manifest)
        static_ok = self._code_static(manifest, target, code, report) if image_ok else False
        if not image_ok:
            report.add("code", False, f"not checked: {manifest.image} is not pinned")
        ready = report.ok and code is not None
        self._in_sandbox(manifest, target, code, report, ready=ready and static_ok)
        return report

    def _files(self, target: Target, report: Report) -> dict[str, Any] | None:
        try:
            doc = read_manifest(target.manifest)
        except ConfigError as e:
            report.add("files", False, str(e))
            return None
        name = doc.get("name")
        report.name = name if isinstance(name, str) else None
        if target.folder is None:
            if name != target.manifest.stem:
                report.add("files", False, f"{target.manifest.name}: name {name!r} differs from the file name")
                return doc
            report.add("files", True, f"built-in manifest {target.manifest.name}; its code is in its image "
                                      "(see code); its tests are the repository's")
            return doc
        problems = []
        if name != target.folder.name:
            problems.append(f"the folder is named {target.folder.name!r} but the manifest's name is {name!r} "
                            "(a package's folder is named after its tool)")
        stem = name if isinstance(name, str) else target.folder.name
        for wanted in (f"{stem}.py", f"test_{stem}.py"):
            path = target.folder / wanted
            if path.is_symlink() or not path.is_file():
                problems.append(f"{wanted} is missing (or not a regular file)")
        if problems:
            report.add("files", False, "; ".join(problems))
        else:
            report.add("files", True, f"{MANIFEST}, {stem}.py, test_{stem}.py")
        return doc

    def _schema(self, doc: Mapping[str, Any], report: Report) -> bool:
        schema = doc.get("schema")
        if not isinstance(schema, Mapping):
            return report.add("schema", False, "schema is missing: a JSON Schema of the arguments is required")
        try:
            Draft202012Validator.check_schema(schema)
        except SchemaError as e:
            where = "schema" + "".join(f"[{p!r}]" if isinstance(p, int) else f".{p}" for p in e.path)
            return report.add("schema", False, f"not a valid JSON Schema (draft 2020-12): {where}: {e.message}")
        if schema.get("type") != "object":
            return report.add("schema", False, 'schema must say "type": "object" (a call\'s arguments are an object)')
        props = schema.get("properties") or {}
        return report.add("schema", True, f"a valid JSON Schema (draft 2020-12) of an object, "
                                          f"{len(props)} propert{'y' if len(props) == 1 else 'ies'}")

    def _risk(self, doc: Mapping[str, Any], report: Report) -> bool:
        problems = [f"{flag} must be stated, true or false" for flag in ("mutates", "reversible")
                    if not isinstance(doc.get(flag), bool)]
        cost = doc.get("cost")
        if "cost" not in doc:
            problems.append("cost must be stated (a number >= 0, charged to a run's budget per call)")
        elif isinstance(cost, bool) or not isinstance(cost, (int, float)) or cost < 0:
            problems.append(f"cost must be a number >= 0, not {cost!r}")
        if problems:
            return report.add("risk", False, "; ".join(problems) + " (risk metadata is never defaulted)")
        return report.add("risk", True, f"mutates {str(doc['mutates']).lower()}, reversible "
                                        f"{str(doc['reversible']).lower()}, cost {cost:g}")

    def _limits(self, doc: Mapping[str, Any], report: Report) -> bool:
        raw = doc.get("limits", {})
        if not isinstance(raw, Mapping):
            return report.add("limits", False, "limits must be an object")
        problems = []
        defaults = ToolLimits()
        values: dict[str, float] = {}
        for key, value in raw.items():
            if key not in _RANGES:
                problems.append(f"limits.{key} is not a limit (one of {', '.join(_RANGES)})")
            elif isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                problems.append(f"limits.{key} must be a positive number, not {value!r}")
            else:
                low, high = _RANGES[key]
                if not low <= value <= high:
                    problems.append(f"limits.{key} {value:g} is outside the sandbox's range [{low:g}, {high:g}]")
                values[key] = value
        effective = ToolLimits(**{k: type(getattr(defaults, k))(values.get(k, getattr(defaults, k)))
                                  for k in _RANGES})
        problems += [f"{key} {why} in {self.caps_from}" for key, why in limit_problems(effective, self.caps)]
        if problems:
            return report.add("limits", False, "; ".join(problems))
        return report.add("limits", True, (
            f"memory {effective.memory_bytes // MiB} MiB, cpus {effective.cpus:g}, pids {effective.pids}, "
            f"timeout {effective.timeout_s:g}s, stdout {effective.stdout_limit // KiB} KiB, stderr "
            f"{effective.stderr_limit // KiB} KiB: within the caps of {self.caps_from}"))

    def _manifest(self, doc: Mapping[str, Any], target: Target, report: Report, *, schema_ok: bool,
                  risk_ok: bool, limits_ok: bool) -> ToolManifest | None:
        # What failed above is put aside (a neutral value in its place), so that this check
        # names the other problems instead of the same one again.
        rest = dict(doc)
        if not schema_ok:
            rest["schema"] = {"type": "object"}
        if not risk_ok:
            rest["mutates"] = doc["mutates"] if isinstance(doc.get("mutates"), bool) else "reconcile" in doc
            rest["reversible"] = doc["reversible"] if isinstance(doc.get("reversible"), bool) else True
            rest["cost"] = 0
        if not limits_ok:
            rest.pop("limits", None)
        try:
            manifest = parse_manifest(rest, source=MANIFEST)
        except ConfigError as e:
            key = e.key.split(":", 1)[1] if ":" in e.key else e.key
            report.add("manifest", False, f"{key}: {e.violations[0].description if e.violations else e}")
            return None
        taken = self.builtin.get(manifest.name)
        if taken is not None and target.folder is not None:
            report.add("manifest", False, f"name {manifest.name!r} is a built-in tool's ({taken}): the server "
                                          "refuses a name defined twice; choose another")
            return None
        if not (schema_ok and risk_ok and limits_ok):
            # Good enough to name its image and find its code; the sandbox is not reached.
            report.add("manifest", True, "the other fields are valid (the problems are above)")
            return manifest
        parts = [f"image {manifest.image}", f"runtime {manifest.runtime}",
                 f"egress {', '.join(manifest.egress_hosts) if manifest.egress_hosts else 'none'}"]
        if manifest.workspace:
            parts.append(f"workspace {manifest.workspace}")
        report.add("manifest", True, "; ".join(parts))
        return manifest

    def _image(self, manifest: ToolManifest, report: Report) -> bool:
        entry = self.images.lock.get(manifest.image)
        if entry is None:
            found = self.images.spec(manifest.image)
            why = (f"images/{manifest.image} has a spec but is not pinned yet: run `{self.images.build_hint()}`"
                   if found is not None else
                   f"no image {manifest.image!r} in {self.images.where} or the built-in lock, and no spec of that "
                   "name: name an image of your images dir (--images-dir, or [images] dir in --config)")
            return report.add("image", False, why)
        own = self.images.lock.owns(manifest.image)
        kind = "" if entry.reproducible else ", adopted (not reproducible)"
        where = self.images.where if own else "the built-in lock"
        return report.add("image", True, f"{manifest.image} is pinned as {entry.id[:19]}… in {where}{kind}")

    def _code_file(self, target: Target, manifest: ToolManifest) -> Path | None:
        """The code that should be in the image: the package's file, or for a built-in manifest
        the file the spec chain of its image lays."""
        if target.folder is not None:
            path = target.folder / f"{manifest.name}.py"
            return path if path.is_file() else None
        for spec, _own in self.images.chain(manifest.image):
            laid = spec.lays_tool(manifest.name)
            if laid is not None:
                return laid
        return None

    def _code_static(self, manifest: ToolManifest, target: Target, code: Path | None, report: Report) -> bool:
        name, image = manifest.name, manifest.image
        target_path = f"/{TOOLS_PATH}/{name}.py"
        chain = self.images.chain(image)
        if not chain:
            return True  # an adopted image has no spec: only the sandbox can tell
        for spec, own in chain:
            entry = self.images.entry(spec.name, own)
            try:
                inputs = spec.inputs_sha256()
            except ImageError as e:  # e.g. a package it lays has no code
                return report.add("code", False, str(e))
            if entry is not None and entry.reproducible and entry.inputs_sha256 != inputs:
                return report.add("code", False, (
                    f"images/{spec.name} changed since {self.images.where if own else 'the built-in lock'} pinned it "
                    f"(a tool's code is among its inputs): run `{self.images.build_hint()}`"))
            laid = spec.lays_tool(name)
            if laid is None:
                continue
            if code is None:
                return report.add("code", False, f"{name}.py is missing")
            if laid.resolve() != code.resolve() and (not laid.is_file() or _sha256(laid) != _sha256(code)):
                return report.add("code", False, f"images/{spec.name} lays {_rel(laid)} at {target_path}, "
                                                 f"not this package's {_rel(code)}")
            return True
        hint = ""
        if target.folder is not None and chain[0][1]:
            rel = os.path.relpath(target.folder.resolve(), chain[0][0].directory.resolve())
            hint = f": add \"tools\": [\"{rel}\"] to images/{image}/image.json and rebuild it"
        return report.add("code", False, f"images/{image} (and its parents) lay no {target_path}{hint}")

    def _in_sandbox(self, manifest: ToolManifest, target: Target, code: Path | None, report: Report, *,
                    ready: bool) -> None:
        builtin = target.folder is None
        if not ready:
            if not any(c.name == "code" for c in report.checks):
                report.add("code", False, "not checked in the sandbox yet: fix the problems above first")
            report.add("tests", builtin, "built-in: its tests are the repository's" if builtin else
                       "not run: fix the problems above first")
            return
        assert code is not None  # `ready` says so
        backend = self.backend()
        if backend is None:
            why = self._backend_error or "no sandbox backend"
            report.add("code", False, f"the sandbox is not usable: {why}")
            report.add("tests", builtin, "built-in: its tests are the repository's" if builtin else
                       f"not run: the sandbox is not usable: {why}")
            return
        with tempfile.TemporaryDirectory(prefix="ringfence-tools-check-") as tmp:
            inputs: tuple[InputMount, ...] = ()
            if not builtin:
                assert target.folder is not None
                try:
                    staged = stage_package(target.folder, Path(tmp) / "package")
                except (SandboxError, OSError) as e:
                    report.add("code", False, f"not checked in the sandbox: the package could not be staged: {e}")
                    report.add("tests", False, f"not run: the package could not be staged: {e}")
                    return
                inputs = (InputMount(str(staged), PACKAGE_MOUNT),)
            lim = manifest.limits
            profile = SandboxProfile(
                image=manifest.image, runtime=manifest.runtime, memory_bytes=max(lim.memory_bytes, 256 * MiB),
                cpus=max(lim.cpus, 1.0), pids=max(lim.pids, 64), timeout_s=self.timeout_s, stdout_limit=64 * KiB,
                stderr_limit=1 * MiB, inputs=inputs)
            request = SandboxRequest(profile=profile, argv=("python3", "-I", "-S", "-B", "-c", SCRIPT, manifest.name),
                                     run_id="tools-check", warm=False)
            try:
                result = backend.run(request)
            except SandboxError as e:
                report.add("code", False, f"the sandbox refused to run: {e}")
                report.add("tests", builtin, "built-in: its tests are the repository's" if builtin else
                           f"not run: {e}")
                return
        where = f"in {manifest.image} {result.image_id[:19]}…, {result.runtime}"
        doc = _report_line(result.stdout)
        if result.outcome is not Outcome.OK or doc is None:
            why = result.outcome.value + (f" after {self.timeout_s:g}s (--timeout)"
                                          if result.outcome is Outcome.TIMEOUT else "")
            report.add("code", False, f"the sandbox run did not finish: {why} ({where})")
            report.add("tests", False, f"{why} ({where}){_tail(result.stderr)}")
            return
        want = _sha256(code)
        got = doc.get("code_sha256")
        if got is None:
            report.add("code", False, f"the pinned image has no /{TOOLS_PATH}/{manifest.name}.py ({where})")
        elif got != want:
            report.add("code", False, f"/{TOOLS_PATH}/{manifest.name}.py in the pinned image is not "
                                      f"{_rel(code)} (sha256 {got[:12]}… against {want[:12]}…): rebuild the image "
                                      f"(`{self.images.build_hint()}`)")
        else:
            report.add("code", True, f"/{TOOLS_PATH}/{manifest.name}.py {where} is {_rel(code)} "
                                     f"(sha256 {want[:12]}…)")
        if builtin:
            report.add("tests", True, "built-in: its tests are the repository's")
            return
        tests = doc.get("tests") or {}
        ran = int(tests.get("ran", 0))
        bad = list(tests.get("failures", [])) + list(tests.get("errors", []))
        if ran == 0:
            report.add("tests", False, f"no test ran: test_*.py files of unittest.TestCase classes ({where})")
        elif bad or tests.get("unexpected_successes"):
            report.add("tests", False, f"{len(bad)} of {ran} failed: {', '.join(bad) or 'unexpected successes'} "
                                       f"({where}){_tail(result.stderr)}")
        else:
            skipped = int(tests.get("skipped", 0))
            report.add("tests", True, f"{ran} test{'s' if ran != 1 else ''} passed"
                                      + (f", {skipped} skipped" if skipped else "")
                                      + f" in {float(tests.get('seconds', 0)):.2f}s ({where}, no network)")


def _report_line(stdout: bytes) -> dict[str, Any] | None:
    for line in reversed(stdout.decode("utf-8", "replace").splitlines()):
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and "code_sha256" in doc:
            return doc
    return None


def _tail(stderr: bytes, lines: int = 30) -> str:
    text = stderr.decode("utf-8", "replace").rstrip()
    if not text:
        return ""
    kept = text.splitlines()[-lines:]
    return "\n" + "\n".join(f"        | {line}" for line in kept)


def stage_package(folder: Path, dest: Path) -> Path:
    """A copy of the package's regular files (no links, no bytecode, no hidden entries) at
    `dest`, world-readable, for the read-only mount: the sandbox user (uid 10001) can read it
    whatever the user's umask was, and the mount shows exactly the package."""
    from ringfence_server.sandbox.archive import stage_files

    files: dict[str, bytes] = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        here = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != "__pycache__"
                             and not (here / d).is_symlink())
        for name in sorted(filenames):
            path = here / name
            if name.startswith(".") or name.endswith((".pyc", ".pyo")):
                continue
            if path.is_symlink() or not path.is_file():
                raise OSError(f"{path} is not a regular file (a package holds regular files only)")
            files[path.relative_to(folder).as_posix()] = path.read_bytes()
    stage_files(files, dest)
    os.chmod(dest, 0o755)
    return dest


def builtin_tools(tools_dir: Path) -> dict[str, Path]:
    """Built-in tool name -> its manifest file (names a package may not take)."""
    from ringfence_server.control.tools import manifest_files

    return {p.stem: p for p in manifest_files(tools_dir)}

