"""The battery's probe helpers (docs/escape-battery.md cases 1-24 and 40-44).

The probe scripts themselves live in the product, in ringfence_server/conformance/probes/, because
`ringfence conformance` runs the same probes against a user's engine and image: one battery,
not two. `HERE`, `source` and `argv` are that package's. What stays here is the tests' side:
`report` (a broken probe fails the test), the settings changes of the red checks, `errnos`.
"""

from __future__ import annotations

import json
from pathlib import Path

from ringfence_server.conformance.probes import HERE, argv, source

__all__ = ["HERE", "argv", "as_root", "docker_stock_seccomp", "errnos", "report", "source", "with_seccomp"]


def report(result) -> dict:
    """The probe's JSON object; fails with the container's output when the probe itself broke."""
    text = result.stdout.decode(errors="replace").strip()
    where = (
        f"outcome={result.outcome} exit={result.exit_code} message={result.message!r}\n"
        f"stdout={text[-2000:]!r}\nstderr={result.stderr.decode(errors='replace')[-2000:]!r}"
    )
    assert result.exit_code == 0 and text, "probe did not run to completion:\n" + where
    try:
        return json.loads(text.splitlines()[-1])
    except ValueError as e:
        raise AssertionError(f"probe printed no JSON ({e}):\n" + where) from e


# ---- settings changes for the red checks (functions from the settings dict to a new dict) ----


def as_root(*caps: str):
    """uid 0 with exactly `caps` added back (cap_drop=ALL stays): the narrowest root."""

    def change(settings: dict) -> dict:
        out = {**settings, "user": "0:0"}
        if caps:
            out["cap_add"] = list(caps)
        return out

    return change


def with_seccomp(profile_json: str):
    """Replace the seccomp profile (never to unconfined here: use without_security_opt for that)."""

    def change(settings: dict) -> dict:
        opts = [o for o in settings["security_opt"] if not o.startswith("seccomp")]
        return {**settings, "security_opt": [*opts, "seccomp=" + profile_json]}

    return change


def docker_stock_seccomp() -> str:
    """Docker's own default profile, unmodified: what we would run without our tightening."""
    from ringfence_server.sandbox import seccomp

    return json.dumps(json.loads(Path(seccomp.source_path()).read_text()), separators=(",", ":"))


def errnos(results: dict) -> dict:
    """{name: errno name or "ok"} from a probe's {name: {"ok"/"ret", "errno"}} map."""
    out = {}
    for name, r in results.items():
        if "ok" in r:
            out[name] = "ok" if r["ok"] else r["errno"]
        else:
            out[name] = "ok" if r["ret"] != -1 else r["errno"]
    return out

