"""Config: embedded defaults, a user file merged over them, errors that name the key."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from ringfence.errors import ConfigError, InvalidArgument
from ringfence.model import Role
from ringfence_server.control.config import DEFAULT_CONFIG_PATH, load_config


def test_defaults_work_with_no_file():
    c = load_config()
    assert c.listen == "127.0.0.1:50051"
    assert c.state_dir == Path.cwd() / ".state"
    assert c.limits.max_steps == 10 and c.limits.max_argument_bytes == 64 * 1024
    assert c.limits.max_message_bytes == 1024 * 1024 and c.limits.max_concurrent_batches == 32
    assert c.policy.autonomy == "standard"
    credit_rules = [(r.tool, r.verdict) for r in c.policy.rules if r.tool == "credit"]
    assert credit_rules == [("credit", "ask"), ("credit", "deny")]
    assert {t.role for t in c.tenants["demo"].tokens} == {Role.AGENT, Role.APPROVER, Role.ADMIN, Role.VERIFIER}


def test_the_documented_dev_tokens_are_the_stored_hashes():
    text = DEFAULT_CONFIG_PATH.read_text()
    documented = dict(re.findall(r"#\s+(agent|approver|admin):\s+(\S+)", text))
    assert set(documented) == {"agent", "approver", "admin"}
    c = load_config()
    for role, token in documented.items():
        tenant, tok = c.principal_for_token(token)
        assert tenant == "demo" and tok.role == role
        assert tok.sha256 == hashlib.sha256(token.encode()).hexdigest()
        assert token not in re.sub(r"#.*", "", text)  # the plaintext only in comments
    assert c.principal_for_token("wrong") is None


def test_a_user_file_merges_over_the_defaults(tmp_path):
    f = tmp_path / "ringfence.toml"
    f.write_text('listen = "0.0.0.0:6000"\n[limits]\nmax_steps = 5\n'
                 '[tenants.acme]\ntokens = [{sha256 = "' + "a" * 64 + '", role = "agent", subject = "bot"}]\n')
    c = load_config(f)
    assert c.listen == "0.0.0.0:6000" and c.limits.max_steps == 5
    assert c.limits.max_plan_steps == 100  # untouched defaults remain
    assert c.state_dir == tmp_path / ".state"  # relative to the file
    assert set(c.tenants) == {"acme"}  # a user [tenants] replaces the public demo tenant
    assert c.policy.rules  # the default policy stays unless replaced


@pytest.mark.parametrize("text,key", [
    ("[limits]\nmax_steps = 0\n", "limits.max_steps"),
    ("[limits]\nmax_steps = 'ten'\n", "limits.max_steps"),
    ("[limits]\nmax_stepz = 3\n", "limits.max_stepz"),
    ("[limits]\nmax_steps = 500\n", "limits.max_steps"),
    ("colour = 'blue'\n", "colour"),
    ("listen = 'nowhere'\n", "listen"),
    ("[policy]\nautonomy = 'yolo'\n", "policy.autonomy"),
    ("[[policy.rules]]\ntool = 'echo'\nverdict = 'maybe'\n", "policy.rules[0].verdict"),
    ("[[policy.rules]]\ntool = 'echo'\nverdict = 'allow'\nwhen = {n = {lte = 'x'}}\n", "policy.rules[0].when.n.lte"),
    ("[[policy.rules]]\ntool = 'echo'\nverdict = 'allow'\nwhen = {n = {like = 1}}\n", "policy.rules[0].when.n.like"),
    ("[tenants.a]\ntokens = [{sha256 = 'plaintext', role = 'agent'}]\n", "tenants.a.tokens[0].sha256"),
    ("[tenants.a]\ntokens = [{sha256 = '" + "b" * 64 + "', role = 'god'}]\n", "tenants.a.tokens[0].role"),
    ("[inputs]\n'/tmp' = '/srv'\n", "inputs./tmp"),
    ("[policy.egress]\nfetch = ['10.0.0.1']\n", "policy.egress.fetch"),
    ("[policy.egress]\nfetch = ['*.com']\n", "policy.egress.fetch"),
    ("[policy.egress]\nfetch = 'api.example.com'\n", "policy.egress.fetch"),
    ("[pool]\nsize = -1\n", "pool.size"),
    ("[pool]\nsize = 'two'\n", "pool.size"),
    ("[pool]\nidle_s = 0\n", "pool.idle_s"),
    ("[pool]\nmax_shapes = 0\n", "pool.max_shapes"),
    ("[pool]\nsize = 4\nmax_size = 3\n", "pool.max_size"),
    ("[pool]\nmax_size = 65\n", "pool.max_size"),
    ("[pool]\nexclude = 'echo'\n", "pool.exclude"),
    ("[pool]\nwarmth = 3\n", "pool.warmth"),
])
def test_errors_name_the_key(tmp_path, text, key):
    f = tmp_path / "ringfence.toml"
    f.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_config(f)
    assert e.value.key == key
    assert isinstance(e.value, InvalidArgument) and e.value.violations[0].field == key


def test_unreadable_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[limits\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)


def test_policy_egress_grants_per_tool_and_for_all(tmp_path):
    f = tmp_path / "ringfence.toml"
    f.write_text("[policy.egress]\nfetch = ['api.example.com:443']\n'*' = ['*.status.example.org']\n")
    policy = load_config(f).policy
    assert policy.egress_for("fetch") == ("api.example.com:443", "*.status.example.org")
    assert policy.egress_for("other") == ("*.status.example.org",)
    assert load_config().policy.egress_for("fetch") == ()  # the defaults grant no egress


def test_the_pool_is_on_by_default_and_configurable(tmp_path):
    assert load_config().pool.size == 2
    f = tmp_path / "ringfence.toml"
    f.write_text("[pool]\nsize = 0\nidle_s = 60\nexclude = ['fetch_url']\n")
    pool = load_config(f).pool
    assert (pool.size, pool.idle_s, pool.max_shapes, pool.exclude) == (0, 60.0, 8, ("fetch_url",))
    assert load_config().pool.max_size == 8
    f.write_text("[pool]\nsize = 12\nmax_size = 12\n")  # a fixed pool
    assert (load_config(f).pool.size, load_config(f).pool.max_size) == (12, 12)
