"""Loading tool packages: what the control plane serves, from the folders its config names.

Two layouts, one loader, the same rules:

- a **package folder** (the user's tools): `<folder>/manifest.json`, `<folder>/<name>.py` and
  (for `ringfence tools check`) `<folder>/test_<name>.py`, where `<name>` is the manifest's name
  and the folder's. `[tools] packages` (ringfence_server.control.config) lists folders of packages: every
  sub-folder that holds a manifest.json is one (a listed folder that holds one itself is a
  single package). Sub-folders without one, and hidden ones, are ignored.
- the **built-in package** (the demo tools): one folder of flat `<name>.json` manifests,
  ringfence_server/control/tools/ (or `tools_dir`), whose code is already in the built-in `tool` image
  (images/tool/rootfs/opt/ringfence/tools/<name>.py): `load_flat`. They were not moved into
  package folders: their code is part of the pinned tool image, and moving it would re-pin
  that image for no change in what runs. `ringfence tools check ringfence_server/control/tools` checks them
  the same way (their code resolved in the image spec that lays it; their tests are the
  repository's, under tests/).

Every manifest is parsed by ringfence_server.control.registry.parse_manifest (the format is docs/TOOLS.md), and
its limits are checked against the server's caps (`[tools] max_*`). A package's manifest must
also state its `cost` (risk metadata is never defaulted in a package; the flat built-in
manifests all state it too), its folder must be named after its tool, and its code must be
there. A tool name defined twice, in any two places, is a ConfigError naming both.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ringfence.errors import ConfigError
from ringfence_server.control.config import Config, ToolsConfig
from ringfence_server.control.registry import Registry, ToolLimits, ToolManifest, load_manifest_file, parse_manifest

MANIFEST = "manifest.json"


@dataclass(frozen=True)
class ToolPackage:
    """One tool as loaded: its manifest and where it came from."""

    manifest: ToolManifest
    source: Path
    """The manifest file."""
    folder: Path | None = None
    """The package folder; None for a flat built-in manifest (its code is in its image)."""

    @property
    def name(self) -> str:
        return self.manifest.name

    @property
    def code(self) -> Path | None:
        """`<folder>/<name>.py` (None for a built-in manifest: see ringfence_server.imagebuild.spec.lays_tool)."""
        return self.folder / f"{self.name}.py" if self.folder is not None else None

    @property
    def tests(self) -> Path | None:
        return self.folder / f"test_{self.name}.py" if self.folder is not None else None


def package_folders(folder: Path) -> list[Path]:
    """The packages under `folder`: itself when it holds a manifest.json, else each sub-folder
    that does (sorted; hidden folders ignored)."""
    folder = Path(folder)
    if (folder / MANIFEST).is_file():
        return [folder]
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir()
                  if p.is_dir() and not p.name.startswith(".") and (p / MANIFEST).is_file())


def read_manifest(path: Path) -> dict[str, Any]:
    """A manifest file's JSON object, or a ConfigError naming the file."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ConfigError(str(path), f"cannot load manifest: {e}") from e
    if not isinstance(doc, dict):
        raise ConfigError(str(path), "a manifest is a JSON object")
    return doc


def limit_problems(limits: ToolLimits, caps: ToolsConfig) -> list[tuple[str, str]]:
    """(`limits.<name>`, why) for each of a manifest's limits over the server's cap."""
    out = []
    for name, cap in caps.caps().items():
        value = float(getattr(limits, name))
        if value > cap:
            out.append((f"limits.{name}", f"{value:g} is over the server's cap {cap:g} (tools.max_{name})"))
    return out


def _within_caps(manifest: ToolManifest, source: Path, caps: ToolsConfig) -> None:
    problems = limit_problems(manifest.limits, caps)
    if problems:
        key, why = problems[0]
        raise ConfigError(f"{source}:{key}", why)


def load_package(folder: Path, caps: ToolsConfig | None = None) -> ToolPackage:
    """One package folder, checked as the server checks it (ConfigError naming the file and key)."""
    folder = Path(folder)
    source = folder / MANIFEST
    doc = read_manifest(source)
    manifest = parse_manifest(doc, source=str(source))
    if manifest.name != folder.name:
        raise ConfigError(f"{source}:name", f"{manifest.name!r}: a package's folder is named after its tool "
                                            f"(this one is {folder.name!r})")
    if "cost" not in doc:
        raise ConfigError(f"{source}:cost", "is required in a package (risk metadata is never defaulted)")
    code = folder / f"{manifest.name}.py"
    if not code.is_file() or code.is_symlink():
        raise ConfigError(str(folder), f"the package has no {code.name} (its code, a regular file)")
    _within_caps(manifest, source, caps or ToolsConfig())
    return ToolPackage(manifest, source, folder)


def load_flat(folder: Path, caps: ToolsConfig | None = None) -> list[ToolPackage]:
    """The built-in layout: every `<name>.json` (or .toml) manifest of `folder`."""
    from ringfence_server.control.tools import manifest_files

    out = []
    for path in manifest_files(folder):
        manifest = load_manifest_file(path)
        _within_caps(manifest, path, caps or ToolsConfig())
        out.append(ToolPackage(manifest, path))
    return out


def unique(packages: Iterable[ToolPackage]) -> list[ToolPackage]:
    """`packages`, refusing a tool name defined twice (naming both places)."""
    seen: dict[str, ToolPackage] = {}
    for p in packages:
        first = seen.get(p.name)
        if first is not None:
            raise ConfigError(f"tools.{p.name}", f"defined twice: in {first.source} and in {p.source}")
        seen[p.name] = p
    return list(seen.values())


def load_all(config: Config) -> list[ToolPackage]:
    """The built-in tools (`tools_dir`), then every package of `[tools] packages`, then the
    exposed tools of every MCP server of `[mcp] servers` (SERVER.TOOL, from its declaration)."""
    from ringfence_server.control.mcp_servers.declaration import load_servers

    caps = config.tools
    found = load_flat(config.tools_dir, caps)
    for folder in config.tools.packages:
        found += [load_package(p, caps) for p in package_folders(folder)]
    for server in load_servers(config):
        found += [ToolPackage(m, server.source) for m in server.manifests]
    return unique(found)


def registry_from_config(config: Config) -> Registry:
    """The registry `ringfence serve` serves: every tool of `load_all`."""
    return Registry(p.manifest for p in load_all(config))

