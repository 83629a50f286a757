"""Runs a console script of the wheels in /opt/ringfence/site: `ringfence mcp-servers add` wrote it.

    python3 -I -S -B /opt/ringfence/mcp_entry.py SCRIPT [ARG...]

The image has no console-script files (a wheel's scripts name the build host's interpreter), so
the entry point named SCRIPT is looked up in the wheels' metadata (group console_scripts) and
called with sys.argv = [SCRIPT, ARG...]; what it returns is the exit status.
"""

import sys

# After the standard library (-I -S: no site-packages, no script folder), so a wheel cannot
# shadow a standard module.
sys.path.append("/opt/ringfence/site")

from importlib.metadata import entry_points  # noqa: E402


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: mcp_entry.py SCRIPT [ARG...]")
    name = sys.argv[1]
    found = sorted(entry_points(group="console_scripts", name=name), key=lambda e: e.value)
    if not found:
        sys.exit(f"mcp_entry.py: no console script {name!r} in /opt/ringfence/site")
    script = found[0].load()
    sys.argv = [name, *sys.argv[2:]]
    sys.exit(script())


if __name__ == "__main__":
    main()
