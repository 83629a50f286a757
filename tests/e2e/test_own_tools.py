"""Your own tools, end to end: "Your own tools" of docs/tools-and-images.md, run as written in a
project folder outside the checkout.

`ringfence tools new jq_table` scaffolds the package and its image spec; the page's files
(the image pinning Debian's jq and the tabulate wheel, the manifest, the code, its tests, the
server's config) are written over the scaffold as the page shows them; `images fetch` fetches
from the real Debian mirror and PyPI; `images build --update-lock` pins the image; `images build
--force --offline` builds it again from scratch in a network namespace of its own (root only)
with the mirror and index pointed nowhere, to the same image ID; `tools check` passes every
check, the tests running in the sandbox; `ringfence serve --config ringfence.toml` serves the
tool from that folder's config (its `[tools] packages`, its `[images] dir`, its policy rule);
the page's SDK script calls it through the API, and the result shows jq and the wheel at work
in the sandbox. Then the failures: a bad schema and limits over the caps, each named by `tools
check`; a changed tool, which `tools check` and `images verify` name as a drifted image.

Every line is run by the installed `ringfence` script (this checkout's code) in a subprocess,
as a user would run it. The image carries the product labels and this session's label (added to
the page's image.json here) and is removed at the end; the built-in images are only read.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import docker.errors
import pytest
from docs_support import DOCS, blocks, section, sh_lines
from serve_support import ROOT, Served

from ringfence_server.sandbox import labels as L
from ringfence_server.sandbox.pinned_images import lock_for

pytestmark = [pytest.mark.docker, pytest.mark.slow]

RINGFENCE = str(Path(sys.executable).with_name("ringfence"))
SESSION = os.environ[L.TEST_SESSION_ENV]
TEST_LABELS = {L.PRODUCT_LABEL: L.PRODUCT, L.PURPOSE_LABEL: "test", L.TEST_SESSION_LABEL: SESSION}
NOWHERE = {"PIP_INDEX_URL": "http://127.0.0.1:9/simple", "http_proxy": "http://127.0.0.1:9",
           "https_proxy": "http://127.0.0.1:9", "no_proxy": ""}
CHECKS = ("files", "schema", "risk", "limits", "manifest", "image", "code", "tests")


def run(project: Path, line: str, *, netns: bool = False,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    argv = shlex.split(line)
    assert argv[0] == "ringfence", line
    argv[0] = RINGFENCE
    if netns:
        argv = ["unshare", "--net", "--", *argv]
    return subprocess.run(argv, cwd=project, capture_output=True, text=True, timeout=900,
                          env={**os.environ, **(env or {})})


def remove_image(client, image_id: str) -> None:
    with contextlib.suppress(docker.errors.ImageNotFound):
        client.images.remove(image_id, force=True)


@pytest.fixture(scope="module")
def walked(docker_client, pinned_images, tmp_path_factory):
    """The page's lines, in order, with what each printed and how long it took."""
    project = tmp_path_factory.mktemp("own-tools")
    assert ROOT not in project.parents and project != ROOT
    text = section(DOCS / "tools-and-images.md", "Your own tools")
    lines = sh_lines(text)
    kinds = ["tools new", "images fetch", "images build", "images build", "tools check", "serve"]
    assert [" ".join(shlex.split(ln)[1:3]) if "serve" not in ln else "serve" for ln in lines] == kinds, lines
    new, fetch, build, rebuild, check, serve = lines
    assert "--update-lock" in build and "--force --offline" in rebuild
    assert serve == "ringfence serve --config ringfence.toml"
    runs: dict[str, subprocess.CompletedProcess[str]] = {}
    timings: dict[str, float] = {}
    ids: list[str] = []
    netns = os.geteuid() == 0 and shutil.which("unshare") is not None
    t_all = time.monotonic()

    def step(name: str, line: str, **kw) -> subprocess.CompletedProcess[str]:
        t0 = time.monotonic()
        runs[name] = run(project, line, **kw)
        timings[name] = time.monotonic() - t0
        assert runs[name].returncode == 0, f"{line}\n{runs[name].stdout[-3000:]}\n{runs[name].stderr[-3000:]}"
        return runs[name]

    def label(spec: Path) -> None:
        doc = json.loads(spec.read_text())
        doc["labels"] = {**doc.get("labels", {}), **TEST_LABELS}
        spec.write_text(json.dumps(doc, indent=2))

    try:
        step("tools new", new)
        scaffolded = {p.relative_to(project).as_posix() for p in project.rglob("*") if p.is_file()}
        # Not on the page: the scaffold as it is builds, and passes every check in the sandbox.
        label(project / "images/jq-table/image.json")
        step("scaffold build", "ringfence images build --images-dir images --update-lock")
        ids.append(lock_for(project / "images").image_id("jq-table"))
        step("scaffold check", "ringfence tools check tools/jq_table --images-dir images")
        # The page's files over the scaffold, as written (the image gets the test labels).
        files = {path: content for _lang, path, content in blocks(text) if path is not None}
        assert set(files) == scaffolded | {"ringfence.toml"}, (set(files), scaffolded)
        for path, content in files.items():
            (project / path).write_text(content)
        label(project / "images/jq-table/image.json")
        step("images fetch", fetch)
        step("images build", build)
        images = project / "images"
        ids.append(lock_for(images).image_id("jq-table"))
        step("rebuild offline", rebuild, netns=netns, env=NOWHERE)
        ids.append(lock_for(images).image_id("jq-table"))
        step("tools check", check)

        t0 = time.monotonic()
        served = Served(project / "ringfence.toml", project / ".state", command=[RINGFENCE], cwd=project)
        try:
            [script] = [content for lang, path, content in blocks(text) if lang == "python" and path is None]
            (project / "call.py").write_text(script)
            call = subprocess.run([sys.executable, "call.py"], cwd=project, capture_output=True, text=True,
                                  timeout=180, env={**os.environ, "RINGFENCE_SERVER": served.address,
                                                    "PYTHONPATH": str(ROOT)})
        finally:
            code = served.stop()
        timings["serve and call"] = time.monotonic() - t0
        assert code == 0, served.lines
        timings["total"] = time.monotonic() - t_all
        yield {"project": project, "runs": runs, "timings": timings, "ids": ids, "netns": netns, "call": call,
               "server_stderr": served.proc.stderr.read(), "check_line": check}
    finally:
        for image_id in set(ids):
            remove_image(docker_client, image_id)


def test_the_scaffold_builds_and_passes_every_check_as_it_is(walked):
    out = walked["runs"]["tools new"].stdout
    assert "created tools/jq_table/manifest.json" in out and "created images/jq-table/image.json" in out
    assert "ringfence images build --images-dir images --update-lock" in out
    check = walked["runs"]["scaffold check"].stdout
    assert "    tests: ok: 2 tests passed" in check and check.rstrip().endswith("every check passed")
    scaffold, page_tool = walked["ids"][0], walked["ids"][1]
    assert scaffold != page_tool  # the page's tool is another image


def test_the_image_is_built_twice_to_one_id_the_second_time_offline(walked, docker_client):
    _scaffold, first, second = walked["ids"]
    assert first == second
    runs = walked["runs"]
    assert f"assembled {first}" in runs["images build"].stderr
    assert f"assembled {second}" in runs["rebuild offline"].stderr
    offline = runs["rebuild offline"].stderr
    assert "downloaded" not in offline and "index from" not in offline
    fetched = runs["images fetch"].stderr
    assert "jq needs libjq1=" in fetched and "1 wheel(s)" in fetched
    entry = lock_for(walked["project"] / "images").entry("jq-table")
    assert {d.name for d in entry.debs} == {"jq", "libjq1", "libonig5"}
    assert [w.name for w in entry.wheels] == ["tabulate"]
    assert docker_client.images.get(first).attrs["Config"]["Labels"][L.TEST_SESSION_LABEL] == SESSION
    print(f"\ntimings: {', '.join(f'{k} {v:.1f}s' for k, v in walked['timings'].items())}; "
          f"offline rebuild in its own network namespace: {walked['netns']}")


def test_tools_check_passes_every_check_with_the_tests_run_in_the_sandbox(walked):
    out = walked["runs"]["tools check"].stdout
    lines = out.splitlines()
    assert lines[0] == "tools/jq_table: jq_table"
    assert [ln.split(":")[0].strip() for ln in lines[1:9]] == list(CHECKS)
    assert all(ln.split(": ")[1] == "ok" for ln in lines[1:9]), out
    assert "3 tests passed" in out and f"in jq-table {walked['ids'][1][:19]}" in out
    assert "/opt/ringfence/tools/jq_table.py" in out
    assert lines[-1] == "tools check: 1 package, every check passed"


def test_the_tool_is_served_from_the_project_and_called_through_the_api(walked):
    call = walked["call"]
    assert call.returncode == 0, call.stderr[-3000:]
    first, *table = call.stdout.splitlines()
    # The page says what it prints: jq (the Debian package) and tabulate (the wheel), both
    # used in the sandbox, in the image the project pinned.
    assert first == "executed jq-1.6 0.9.0 /opt/ringfence/site/tabulate/__init__.py"
    assert [row.split() for row in table] == [["name", "from"], ["--------", "------"], ["jq", "deb"],
                                              ["tabulate", "wheel"]]
    assert "ringfence: tool packages: jq_table (" in walked["server_stderr"]


def test_tools_check_names_a_bad_schema_and_limits_over_the_caps(walked):
    project = walked["project"]
    broken = project / "broken" / "jq_table"
    shutil.copytree(project / "tools" / "jq_table", broken)
    doc = json.loads((broken / "manifest.json").read_text())
    doc["schema"]["properties"]["filter"]["maxLength"] = "two hundred"
    doc["limits"]["timeout_s"] = 600
    (broken / "manifest.json").write_text(json.dumps(doc))
    r = run(project, "ringfence tools check broken/jq_table --config ringfence.toml")
    assert r.returncode == 1, r.stdout
    assert ("    schema: FAILED: not a valid JSON Schema (draft 2020-12): schema.properties.filter.maxLength: "
            "'two hundred' is not of type 'integer'") in r.stdout
    assert ("    limits: FAILED: limits.timeout_s 600 is over the server's cap 300 (tools.max_timeout_s) in "
            "ringfence.toml") in r.stdout
    assert "    tests: FAILED: not run: fix the problems above first" in r.stdout
    assert r.stdout.rstrip().endswith("failed: jq_table (schema, limits, code, tests)")
    # --json for CI says the same.
    j = run(project, "ringfence tools check broken/jq_table --config ringfence.toml --json")
    assert j.returncode == 1
    checks = {c["check"]: c for c in json.loads(j.stdout)["packages"][0]["checks"]}
    assert not checks["schema"]["ok"] and not checks["limits"]["ok"] and checks["risk"]["ok"]


def test_a_changed_tool_is_a_drifted_image_until_it_is_rebuilt(walked):
    project = walked["project"]
    code = project / "tools" / "jq_table" / "jq_table.py"
    before = code.read_text()
    try:
        code.write_text(before + "\n# changed after the image was built\n")
        r = run(project, walked["check_line"])
        assert r.returncode == 1
        assert "    code: FAILED: images/jq-table changed since" in r.stdout
        assert "(a tool's code is among its inputs)" in r.stdout
        v = run(project, "ringfence images verify --images-dir images")
        assert v.returncode == 1 and "jq-table: drifted: images/jq-table changed since the lock was written" in v.stderr
    finally:
        code.write_text(before)
    assert run(project, "ringfence images verify --images-dir images").returncode == 0
