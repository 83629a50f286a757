"""`ringfence mcp-servers add` (ringfence_server.control.mcp_servers.scaffold): the parts that need
no engine and no network. The declaration's TOML read back by tomllib, the console script found
in a wheel made here, the names refused, an existing folder refused with nothing written, the
image spec the images machinery's own parser accepts, the launcher run on a site folder made
here, and the resolution itself: pip offline (PIP_NO_INDEX) on a wheelhouse of wheels made here.

The real packages, built into an image that answers tools/list, are in
tests/integration/test_mcp_scaffold_build.py.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ringfence_server.control.mcp_servers import scaffold, scaffold_cli
from ringfence_server.imagebuild.pins import DebPin
from ringfence_server.imagebuild.spec import load_spec
from ringfence_server.imagebuild.wheels import Target

TARGET = Target("3.11", "x86_64", "2.36")
AWKWARD = [
    "", "plain", 'say "hi"', "back\\slash", "C:\\new\\table", "line\nbreak\r\n", "tab\there",
    "nul\x00bell\x07esc\x1bdel\x7f", "unit\x1fsep", "ünïcödé", "日本語", "emoji 🦀 and 𝄞", "\u2028\u2029",
    "'single'", "'''triple'''", '"""', "# not a comment", "[not.a.table]", "key = value", "\\u0041",
]


def parse(text: str) -> dict[str, object]:
    return tomllib.loads(text)


# -- the TOML writer ---------------------------------------------------------------------------------


def test_the_declaration_is_the_documented_format(tmp_path):
    path = scaffold.write_declaration(
        tmp_path / "time", name="time", image="mcp-time",
        command=scaffold.command("mcp-server-time", ["--local-timezone", "UTC"]))
    assert path == tmp_path / "time" / "server.toml"
    lines = path.read_text().splitlines()
    assert lines[0].startswith("# ")
    assert lines[1:] == [
        'name = "time"',
        'image = "mcp-time"',
        'command = ["python3", "-I", "-S", "-B", "/opt/ringfence/mcp_entry.py", "mcp-server-time", '
        '"--local-timezone", "UTC"]',
        "egress_hosts = []",
        'workspace = ""',
        "[limits]",
        "memory_bytes = 268435456",
        "cpus = 0.5",
        "pids = 64",
        "timeout_s = 30",
        "stdout_limit = 1048576",
    ]
    assert parse(path.read_text()) == {
        "name": "time", "image": "mcp-time",
        "command": ["python3", "-I", "-S", "-B", "/opt/ringfence/mcp_entry.py", "mcp-server-time",
                    "--local-timezone", "UTC"],
        "egress_hosts": [], "workspace": "",
        "limits": {"memory_bytes": 268435456, "cpus": 0.5, "pids": 64, "timeout_s": 30, "stdout_limit": 1048576},
    }


def test_awkward_strings_and_the_tool_tables_parse_back_to_the_same_values(tmp_path):
    tools = {
        "get_current_time": {"mutates": False, "reversible": True, "cost": 0.0, "expose": True,
                             "description": AWKWARD[7] + AWKWARD[2] + AWKWARD[11]},
        "a.dotted-name": {"mutates": True, "reversible": False, "cost": 1.25, "expose": False,
                          "url_arguments": ["url", 'we"ird']},
        "ünï": {"mutates": False, "reversible": True, "cost": 3, "description": None},
    }
    path = scaffold.write_declaration(
        tmp_path / "s", name="s", image="mcp-s", command=["python3", *AWKWARD],
        egress_hosts=["example.com", "api.example.org"], workspace="read", runtime="gvisor", tools=tools)
    doc = parse(path.read_text(encoding="utf-8"))
    assert doc["command"] == ["python3", *AWKWARD]
    assert doc["egress_hosts"] == ["example.com", "api.example.org"]
    assert (doc["workspace"], doc["runtime"]) == ("read", "gvisor")
    # A None leaves the key out; everything else comes back as it went in, types included.
    expected = {k: {kk: vv for kk, vv in v.items() if vv is not None} for k, v in tools.items()}
    assert doc["tools"] == expected
    assert isinstance(doc["tools"]["ünï"]["cost"], int)  # type: ignore[index]
    # Written again (as the lead's tool-listing step does): the same file, byte for byte.
    first = path.read_bytes()
    scaffold.write_declaration(
        tmp_path / "s", name="s", image="mcp-s", command=["python3", *AWKWARD],
        egress_hosts=["example.com", "api.example.org"], workspace="read", runtime="gvisor", tools=tools)
    assert path.read_bytes() == first


@pytest.mark.parametrize("value", AWKWARD)
def test_each_awkward_string_is_one_valid_basic_string(value):
    assert parse(f"v = {scaffold.toml_value(value)}") == {"v": value}
    assert parse(f"{scaffold.toml_key(value or 'x')} = 1") == {value or "x": 1}


@settings(max_examples=300, deadline=None)
@given(st.text(), st.lists(st.text(), max_size=4), st.integers(-(2**63), 2**63 - 1),
       st.floats(allow_nan=False, allow_infinity=False), st.booleans())
def test_any_text_and_number_round_trip(text, texts, integer, number, flag):
    doc = "\n".join(f"{k} = {scaffold.toml_value(v)}" for k, v in
                    [("t", text), ("l", texts), ("i", integer), ("f", number), ("b", flag)])
    assert parse(doc) == {"t": text, "l": texts, "i": integer, "f": number, "b": flag}


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), {"a": None}, b"bytes", "\ud800", [None]])
def test_what_toml_cannot_hold_is_refused_before_writing(tmp_path, bad):
    with pytest.raises(ValueError):
        scaffold.toml_value(bad)
    with pytest.raises(ValueError):
        scaffold.write_declaration(tmp_path / "x", name="x", image="mcp-x", command=["python3"],
                                   tools={"t": {"mutates": False, "reversible": True, "cost": bad}})
    assert not (tmp_path / "x" / "server.toml").exists()


def test_an_unknown_tool_key_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown keys"):
        scaffold.write_declaration(tmp_path / "x", name="x", image="mcp-x", command=["python3"],
                                   tools={"t": {"risky": True}})


def test_the_server_name_rule_is_the_declarations():
    from ringfence_server.control.mcp_servers import declaration

    assert scaffold.SERVER_NAME.pattern == declaration.SERVER_NAME.pattern
    assert scaffold.SERVER_FILE == declaration.SERVER_FILE
    assert set(scaffold.TOOL_KEYS) == declaration._TOOL_KEYS


# -- names, requirements, folders ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["time", "git", "a", "my_server2", "a" * 32])
def test_good_names(name):
    scaffold.check_name(name)
    assert scaffold.image_name(name) == "mcp-" + name.replace("_", "-")


@pytest.mark.parametrize("name", ["", "Time", "2fa", "_x", "my-server", "a.b", "a" * 33, "tïme", "x y", "../x"])
def test_bad_names_are_refused(name):
    with pytest.raises(scaffold.ScaffoldError, match="is not a server name"):
        scaffold.check_name(name)


@pytest.mark.parametrize("text, expected", [
    ("mcp-server-time==2026.10.19", ("mcp-server-time", "2026.10.19")),
    ("Mcp_Server.Fetch==1.0.post1", ("Mcp_Server.Fetch", "1.0.post1")),
])
def test_requirements(text, expected):
    assert scaffold.parse_requirement(text) == expected


@pytest.mark.parametrize("text", ["mcp-server-time", "mcp-server-time>=1", "mcp-server-time==1.*",
                                  "mcp-server-time[cli]==1", "x==1; python_version>'3'", "==1", "a==1==2"])
def test_inexact_requirements_are_refused(text):
    with pytest.raises(scaffold.ScaffoldError, match="PKG==VERSION"):
        scaffold.parse_requirement(text)


def test_debian_pins():
    assert scaffold.parse_debian(["git=1:2.39.5-0+deb12u3", "jq=1.6-2.1+deb12u2"]) == (
        DebPin("git", "1:2.39.5-0+deb12u3"), DebPin("jq", "1.6-2.1+deb12u2"))
    for bad in (["git"], ["git=*"], ["git:amd64=1"]):
        with pytest.raises(scaffold.ScaffoldError, match="git"):
            scaffold.parse_debian(bad)
    with pytest.raises(scaffold.ScaffoldError, match="more than once: git"):
        scaffold.parse_debian(["git=1", "git=2"])


def request(tmp_path: Path, name: str = "time", **kw: object) -> scaffold.Request:
    return scaffold.Request(name=name, package="mcp-server-time", version="1.0", images_dir=tmp_path / "images",
                            servers_dir=tmp_path / "servers", **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("existing", ["images/mcp-my-time", "servers/my_time"])
def test_an_existing_folder_is_refused_unless_forced(tmp_path, existing):
    (tmp_path / existing).mkdir(parents=True)
    with pytest.raises(scaffold.ScaffoldError, match=f"{tmp_path / existing} exists: .* --force"):
        scaffold.check_folders(request(tmp_path, "my_time"))
    scaffold.check_folders(request(tmp_path, "my_time", force=True))


def test_a_built_in_image_name_is_refused(tmp_path, monkeypatch):
    builtin = tmp_path / "builtin"
    (builtin / "mcp-x").mkdir(parents=True)
    (builtin / "mcp-x" / "image.json").write_text("{}")
    monkeypatch.setattr(scaffold, "IMAGES_DIR", builtin)
    with pytest.raises(scaffold.ScaffoldError, match="mcp-x is a built-in image"):
        scaffold.check_folders(request(tmp_path, "x"))


def run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="ringfence")
    scaffold_cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


def test_the_command_refuses_an_existing_folder_in_one_line_and_writes_nothing(tmp_path, capsys):
    (tmp_path / "servers" / "time").mkdir(parents=True)
    (tmp_path / "servers" / "time" / "server.toml").write_text("keep = true\n")
    code = run_cli(["mcp-servers", "add", "time", "--package", "mcp-server-time==2026.10.19",
                    "--images-dir", str(tmp_path / "images"), "--servers-dir", str(tmp_path / "servers")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("mcp-servers add: ") and "exists" in err
    assert err.rstrip().endswith("nothing was written")
    assert not (tmp_path / "images").exists()
    assert (tmp_path / "servers" / "time" / "server.toml").read_text() == "keep = true\n"


@pytest.mark.parametrize("argv, message", [
    (["Bad", "--package", "x==1"], "is not a server name"),
    (["ok", "--package", "x>=1"], "PKG==VERSION"),
    (["ok", "--package", "x==1", "--debian", "git"], "name=version"),
])
def test_the_command_reports_bad_usage_in_one_line(tmp_path, capsys, argv, message):
    code = run_cli(["mcp-servers", "add", *argv, "--images-dir", str(tmp_path / "i"),
                    "--servers-dir", str(tmp_path / "s")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and message in err and "Traceback" not in err
    assert not (tmp_path / "i").exists() and not (tmp_path / "s").exists()


# -- wheels: the console script, the pins ----------------------------------------------------------------


def make_wheel(path: Path, files: dict[str, str]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            zf.writestr(zipfile.ZipInfo(name, (2024, 1, 1, 0, 0, 0)), text)
    return path


def dist_wheel(folder: Path, name: str, version: str, *, scripts: dict[str, str] | None = None,
               requires: tuple[str, ...] = (), modules: dict[str, str] | None = None) -> Path:
    """A pure-python wheel as PyPI serves one: METADATA, WHEEL, RECORD, entry_points.txt."""
    dist = f"{name.replace('-', '_')}-{version}.dist-info"
    files = dict(modules or {})
    files[f"{dist}/METADATA"] = "".join(
        ["Metadata-Version: 2.1\n", f"Name: {name}\n", f"Version: {version}\n"]
        + [f"Requires-Dist: {r}\n" for r in requires])
    files[f"{dist}/WHEEL"] = "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    if scripts is not None:
        files[f"{dist}/entry_points.txt"] = "[console_scripts]\n" + "".join(
            f"{k} = {v}\n" for k, v in scripts.items()) + "\n[other.group]\nx = y:z\n"
    files[f"{dist}/RECORD"] = "".join(f"{n},,\n" for n in files) + f"{dist}/RECORD,,\n"
    return make_wheel(folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl", files)


def test_the_console_scripts_are_read_from_the_wheel(tmp_path):
    one = dist_wheel(tmp_path, "mcp-server-demo", "1.0", scripts={"mcp-server-demo": "mcp_server_demo:main"})
    assert scaffold.console_scripts(one) == ["mcp-server-demo"]
    assert scaffold.choose_script(["mcp-server-demo"], None, "p") == "mcp-server-demo"
    (tmp_path / "two").mkdir()
    two = dist_wheel(tmp_path / "two", "multi", "1.0", scripts={"Serve-B": "m:b", "serve-a": "m:a"})
    assert scaffold.console_scripts(two) == ["Serve-B", "serve-a"]  # names keep their case
    with pytest.raises(scaffold.ScaffoldError, match=r"2 console scripts \(Serve-B, serve-a\): choose one with"):
        scaffold.choose_script(scaffold.console_scripts(two), None, "multi==1.0")
    assert scaffold.choose_script(["Serve-B", "serve-a"], "serve-a", "multi==1.0") == "serve-a"
    with pytest.raises(scaffold.ScaffoldError, match=r"--entry nope: multi==1\.0 has no such console script"):
        scaffold.choose_script(["Serve-B", "serve-a"], "nope", "multi==1.0")
    (tmp_path / "none").mkdir()
    none = dist_wheel(tmp_path / "none", "lib", "1.0")
    assert scaffold.console_scripts(none) == []
    with pytest.raises(scaffold.ScaffoldError, match="declares no console script"):
        scaffold.choose_script([], None, "lib==1.0")


def test_wheels_are_pinned_by_the_file_name_and_hash(tmp_path):
    a = make_wheel(tmp_path / "Typing_Extensions-4.16.0-py3-none-any.whl", {"x": "1"})
    b = make_wheel(tmp_path / "rpds_py-2026.9.1-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
                   {"y": "2"})
    pins = scaffold.pin_wheels([a, b], TARGET)
    assert [p.pin() for p in pins] == [
        {"name": "rpds-py", "version": "2026.9.1", "sha256": hashlib.sha256(b.read_bytes()).hexdigest()},
        {"name": "typing-extensions", "version": "4.16.0", "sha256": hashlib.sha256(a.read_bytes()).hexdigest()},
    ]
    c = make_wheel(tmp_path / "x-1-cp312-cp312-manylinux_2_17_x86_64.whl", {})
    with pytest.raises(scaffold.ScaffoldError, match=r"not a wheel for CPython 3\.11"):
        scaffold.pin_wheels([c], TARGET)


# -- the image spec and its launcher ----------------------------------------------------------------------


def test_the_image_spec_is_one_the_images_machinery_accepts(tmp_path):
    req = request(tmp_path, "my_time", debian=(DebPin("git", "1:2.39.5-0+deb12u3"),),
                  args=("--local-timezone", "UTC"))
    wheel = make_wheel(tmp_path / "mcp_server_time-1.0-py3-none-any.whl", {})
    pins = scaffold.pin_wheels([wheel], TARGET)
    written = scaffold.write_image(req.spec_dir, scaffold.image_spec(req, "mcp-server-time", pins))
    assert written == [req.spec_dir / "image.json", req.spec_dir / "rootfs/opt/ringfence/mcp_entry.py"]
    spec = load_spec(req.spec_dir)
    assert spec.name == "mcp-my-time" and spec.parent == "base"
    assert spec.entrypoint == ("/usr/bin/tini", "--")
    assert spec.cmd == ("python3", "-I", "-S", "-B", "/opt/ringfence/mcp_entry.py", "mcp-server-time",
                        "--local-timezone", "UTC")
    assert (spec.user, spec.workdir) == ("10001:10001", "/tmp")
    assert dict(spec.env or ())["HOME"] == "/tmp"
    assert dict(spec.labels) == {"ringfence.image": "mcp-my-time"}
    assert [str(p) for p in spec.packages] == ["git=1:2.39.5-0+deb12u3"]
    assert [(w.name, w.version, w.sha256) for w in spec.wheels] == [("mcp-server-time", "1.0", pins[0].sha256)]


def test_the_launcher_runs_the_named_console_script_with_the_rest_of_argv(tmp_path):
    site = tmp_path / "site"
    (site / "demo_pkg").mkdir(parents=True)
    (site / "demo_pkg" / "__init__.py").write_text(
        "import json, sys\n"
        "def main():\n    print(json.dumps({'argv': sys.argv, 'path': sys.path}))\n    return 3\n")
    dist = site / "demo_pkg-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: demo-pkg\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[console_scripts]\ndemo-server = demo_pkg:main\n")
    launcher = tmp_path / "mcp_entry.py"
    assert scaffold.LAUNCHER.count("/opt/ringfence/site") == 3
    launcher.write_text(scaffold.LAUNCHER.replace('"/opt/ringfence/site"', repr(str(site))))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    run = subprocess.run([sys.executable, "-I", "-S", "-B", str(launcher), "demo-server", "--flag", "a b"],
                         capture_output=True, text=True, env=env, timeout=30)
    assert run.returncode == 3, run.stderr
    out = json.loads(run.stdout)
    assert out["argv"] == ["demo-server", "--flag", "a b"]
    # The site folder comes after the standard library: a wheel cannot shadow it.
    assert out["path"][-1] == str(site)
    missing = subprocess.run([sys.executable, "-I", "-S", "-B", str(launcher), "nope"],
                             capture_output=True, text=True, env=env, timeout=30)
    assert missing.returncode == 1 and "no console script 'nope'" in missing.stderr


# -- the resolution: pip, offline, on wheels made here ------------------------------------------------------


def test_prepare_resolves_every_dependency_offline_and_finds_the_script(tmp_path, monkeypatch):
    house = tmp_path / "house"
    house.mkdir()
    dist_wheel(house, "mcp-server-demo", "1.0", scripts={"mcp-server-demo": "mcp_server_demo:main"},
               requires=("demo-dep>=2",), modules={"mcp_server_demo/__init__.py": "def main(): pass\n"})
    dist_wheel(house, "demo-dep", "2.1", modules={"demo_dep.py": ""})
    dist_wheel(house, "demo-dep", "1.0", modules={"demo_dep.py": ""})  # not what the requirement admits
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(house))
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # nowhere, were the index asked
    req = scaffold.Request(name="demo", package="mcp-server-demo", version="1.0",
                           images_dir=tmp_path / "images", servers_dir=tmp_path / "servers")
    work = tmp_path / "work"
    work.mkdir()
    script, wheels = scaffold.prepare(req, work, lambda _m: None)
    assert script == "mcp-server-demo"
    assert [(w.name, w.version) for w in wheels] == [("demo-dep", "2.1"), ("mcp-server-demo", "1.0")]
    for w in wheels:
        assert w.sha256 == hashlib.sha256(w.path.read_bytes()).hexdigest()
    # Nothing was written outside the work folder; the wheels then go where `images fetch` looks.
    assert not (tmp_path / "images").exists() and not (tmp_path / "servers").exists()
    assert scaffold.seed_wheelhouse(wheels, tmp_path / "images") == 2
    assert scaffold.seed_wheelhouse(wheels, tmp_path / "images") == 0
    for w in wheels:
        assert (tmp_path / "images/.build/wheels" / w.sha256 / w.path.name).is_file()


def test_a_package_pip_cannot_find_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "house").mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "house"))
    req = scaffold.Request(name="demo", package="mcp-server-absent", version="1.0",
                           images_dir=tmp_path / "images", servers_dir=tmp_path / "servers")
    with pytest.raises(scaffold.ScaffoldError) as caught:
        scaffold.prepare(req, tmp_path, lambda _m: None)
    message = str(caught.value)
    assert "pip download mcp-server-absent==1.0 for CPython 3.11" in message
    assert "No matching distribution found for mcp-server-absent==1.0" in message
