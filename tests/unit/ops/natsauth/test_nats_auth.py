"""`ops.natsauth.command`: per-agent permissions, password keeping and rotation, the
credentials format both sides read, inventory parsing (from real `ansible-inventory`
output) and `gpufleet nats-auth` writing files nats-server accepts."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from agent.config import Settings
from ops.kit.embedded_nats import find_nats_server
from ops.kit.nats_bundle import AuthBundle, build
from ops.kit.nats_server_config import credentials_text, parse_server_arg
from ops.kit.nats_users import AgentNode, NatsAuthError, agent_user
from ops.main import run as cli_run
from ops.natsauth.command import nodes_from_json
from procs.nats import (
    CredentialsError,
    NatsIdentity,
    identity_of,
    parse_credentials,
    read_identity,
)
from procs.settings import ConfigError, load
from shared.ids import new_pool_id
from shared.subjects import Subjects

REPO = Path(__file__).resolve().parents[4]
BIN = Path(sys.executable).parent
POOL = new_pool_id()


def fake_hash(password: str) -> str:
    """Stands in for bcrypt (slow on purpose) where only the config's shape matters."""
    return "$fake$" + hashlib.sha256(password.encode()).hexdigest()


def make(
    nodes: list[AgentNode],
    passwords: dict[str, str] | None = None,
    rotate: tuple[str, ...] = (),
    readers: tuple[str, ...] = (),
) -> AuthBundle:
    return build(
        nodes,
        alert_stream="T_ALERTS",
        prefix="t",
        hash_password=fake_hash,
        passwords=passwords,
        rotate=rotate,
        readers=readers,
    )


def test_an_agent_may_publish_and_subscribe_only_its_own_subjects() -> None:
    a, b = AgentNode(POOL, "gpu01.rack2"), AgentNode(POOL, "gpu02")
    bundle = build([a, b], alert_stream="T_ALERTS", prefix="t", hash_password=fake_hash)
    users = {u.name: u for u in bundle.users}
    s = Subjects("t")
    perms = users[agent_user(a)].permissions
    # The dotted node id is one subject token, as the agent publishes it.
    node = "gpu01.rack2"
    assert perms.publish == (s.heartbeat(POOL, node), s.inventory(POOL, node), s.use(POOL, node))
    assert perms.publish[0] == f"t.hb.{POOL}.gpu01%2Erack2"
    # Its own node's bookings in any pool (a pool move), and nothing else wildcarded.
    assert perms.subscribe == (
        s.inventory_request(POOL, node),
        s.use_request(POOL, node),
        "t.bookings.*.gpu01%2Erack2",
    )
    assert not any("*" in p or ">" in p for p in perms.publish + perms.subscribe[:2])
    assert perms.allow_responses
    coord = users["coordinator"].permissions
    assert "t.hb.>" in coord.subscribe and "t.invreq.>" in coord.publish
    assert "t.use.>" in coord.subscribe and "t.usereq.>" in coord.publish
    assert "t.bookings.>" in coord.publish
    assert "$JS.API.>" in coord.publish
    assert "t.alert.>" in coord.subscribe  # the console's feed
    conf = bundle.authorization
    assert f'"t.hb.{POOL}.gpu02"' in conf
    for pw in bundle.passwords.values():
        assert fake_hash(pw) in conf
    assert not any(pw in conf for pw in bundle.passwords.values())


def test_regenerating_keeps_passwords_rotates_on_request_and_drops_removed_nodes() -> None:
    a, b, c = AgentNode(POOL, "a"), AgentNode(POOL, "b"), AgentNode(POOL, "c")
    first = make([a, b])
    assert first.changed == {"coordinator", agent_user(a), agent_user(b)}
    second = make([a, c], passwords=dict(first.passwords), rotate=(agent_user(a),))
    old, new = first.passwords, second.passwords
    assert new["coordinator"] == old["coordinator"]
    assert new[agent_user(a)] != old[agent_user(a)]
    assert agent_user(b) not in new
    assert second.changed == {agent_user(a), agent_user(c)}
    everything = make([a], passwords=dict(new), rotate=("all",))
    assert all(everything.passwords[u] != new[u] for u in everything.passwords)
    with pytest.raises(NatsAuthError, match="no such user"):
        make([a], rotate=("agent:nope",))


def test_bad_input_is_refused_with_the_node_named() -> None:
    with pytest.raises(NatsAuthError, match="bad node"):
        AgentNode(POOL, "bad node")
    with pytest.raises(NatsAuthError, match="pool id"):
        AgentNode("pool-1", "n1")
    with pytest.raises(NatsAuthError, match="more than one pool"):
        make([AgentNode(POOL, "n1"), AgentNode(new_pool_id(), "n1")])
    with pytest.raises(NatsAuthError, match="reader name"):
        make([], readers=("a b",))
    with pytest.raises(NatsAuthError, match="forwarder durable"):
        build([], alert_stream="T_ALERTS", hash_password=fake_hash, forwarders=["a.b"])


def test_readers_get_no_consumers_and_a_forwarder_only_the_one_named_after_it() -> None:
    """What a reader's and a forwarder's permissions name; the integration test shows
    nats-server holding them to it. No legacy `CONSUMER.CREATE.<stream>` anywhere: the
    server takes the consumer's name from the body there, and updates one that exists."""
    bundle = build(
        [],
        alert_stream="T_ALERTS",
        prefix="t",
        hash_password=fake_hash,
        readers=["prom", "prom.b"],
        forwarders=["fwd-b"],
    )
    users = {u.name: u for u in bundle.users}
    reader = users["reader:prom"].permissions
    assert not [p for p in reader.publish if "CONSUMER" in p or "$JS.ACK" in p]
    assert reader.subscribe == ("t.alert.>", "_INBOX_reader:prom.>")
    assert reader.inbox_prefix == "_INBOX_reader:prom"
    # A dot in a reader's name does not make its prefix another's subtree.
    assert users["reader:prom.b"].permissions.inbox_prefix == "_INBOX_reader:prom%2Eb"
    fwd = users["forwarder:fwd-b"]
    assert fwd.role == "forwarder" and fwd.creds_filename == "forwarder-fwd-b.creds"
    consumer_subjects = [p for p in fwd.permissions.publish if "CONSUMER" in p or "ACK" in p]
    assert consumer_subjects == [
        "$JS.API.CONSUMER.CREATE.T_ALERTS.fwd-b",
        "$JS.API.CONSUMER.CREATE.T_ALERTS.fwd-b.>",
        "$JS.API.CONSUMER.INFO.T_ALERTS.fwd-b",
        "$JS.API.CONSUMER.MSG.NEXT.T_ALERTS.fwd-b",
        "$JS.ACK.T_ALERTS.fwd-b.>",
    ]
    assert fwd.permissions.subscribe == ("_INBOX_forwarder:fwd-b.>",)
    assert "t.alert.>" not in fwd.permissions.publish
    assert "_INBOX.>" not in bundle.authorization.replace('"_INBOX.>"]', "", 1)  # coordinator's
    # Each one's credentials file says where its replies must arrive.
    assert identity(bundle.credentials("forwarder:fwd-b")).nats_py()["inbox_prefix"] == (
        "_INBOX_forwarder:fwd-b"
    )
    assert "inbox_prefix" not in identity(bundle.credentials("coordinator")).nats_py()


def identity(text: str) -> NatsIdentity:
    return identity_of(text, "x.creds", "nats_credentials")


def test_every_process_reads_the_credentials_file_the_generator_writes(tmp_path: Path) -> None:
    creds = tmp_path / "a.creds"
    creds.write_text(credentials_text('agent:p:"n"', 'pa"ss\\word'))
    assert parse_credentials(creds.read_text()) == ('agent:p:"n"', 'pa"ss\\word')
    found = read_identity(str(creds))
    assert found == NatsIdentity(user='agent:p:"n"', password='pa"ss\\word')
    assert found.nats_py() == {"user": 'agent:p:"n"', "password": 'pa"ss\\word'}
    assert 'pa"ss' not in repr(found)  # a password never reaches a log
    # A NATS JWT .creds file goes to nats-py as it is.
    jwt = tmp_path / "nsc.creds"
    jwt.write_text("-----BEGIN NATS USER JWT-----\neyJ0\n------END NATS USER JWT------\n")
    assert read_identity(str(jwt)).nats_py() == {"user_credentials": str(jwt)}
    junk = tmp_path / "junk"
    junk.write_text("user = 1\n")
    with pytest.raises(CredentialsError, match="nats_credentials: needs user and password"):
        read_identity(str(junk))
    with pytest.raises(CredentialsError, match="cannot read"):
        read_identity(str(tmp_path / "missing"))
    # Every process says it as a bad setting (exit 2), naming the field.
    with pytest.raises(ConfigError, match=r"nats_credentials: .*junk: needs user and password"):
        load(Settings, ["--pool-id", new_pool_id(), "--nats-credentials", str(junk)], {})


def test_nodes_come_from_the_example_inventory_through_ansible_inventory(
    tmp_path: Path,
) -> None:
    listed = subprocess.run(
        [str(BIN / "ansible-inventory"), "-i", "inventory/example.yml", "--list"],
        cwd=REPO / "ansible",
        env={**os.environ, "ANSIBLE_HOME": str(tmp_path), "ANSIBLE_LOCAL_TEMP": str(tmp_path)},
        capture_output=True,
        check=True,
        timeout=60,
    )
    nodes = nodes_from_json(json.loads(listed.stdout))
    by_pool: dict[str, list[str]] = {}
    for node in nodes:
        by_pool.setdefault(node.pool_id, []).append(node.node_id)
    assert sorted(len(v) for v in by_pool.values()) == [2, 2]
    assert "gpu-h100-01.example.net" in {n.node_id for n in nodes}
    plain = nodes_from_json({"nodes": [{"poolId": POOL, "nodeId": "x.y"}]})
    assert plain == [AgentNode(POOL, "x.y")]


def test_the_cli_writes_private_files_that_nats_server_accepts(tmp_path: Path) -> None:
    out = tmp_path / "auth"
    nodes = tmp_path / "nodes.json"
    nodes.write_text(json.dumps([{"poolId": POOL, "nodeId": "gpu.1"}]))
    argv = ["nats-auth", "--out", str(out), "--nodes", str(nodes), "--node", f"{POOL}:gpu2"]
    extra = ["--reader", "prom", "--forwarder", "alert-forwarder", "--bcrypt-cost", "4"]
    assert cli_run([*argv, *extra], {}) == 0
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert files == [
        "authorization.conf",
        f"creds/agent-{POOL}-gpu.1.creds",
        f"creds/agent-{POOL}-gpu2.creds",
        "creds/coordinator.creds",
        "creds/forwarder-alert-forwarder.creds",
        "creds/reader-prom.creds",
        "nats-server.conf",
        "passwords.json",
    ]
    for path in out.rglob("*"):
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode & 0o077 == 0, f"{path} is {oct(mode)}"
    checked = subprocess.run(
        [find_nats_server(), "-t", "-c", str(out / "nats-server.conf")],
        capture_output=True,
        timeout=30,
    )
    assert checked.returncode == 0, checked.stderr
    passwords = json.loads((out / "passwords.json").read_text())["gpufleet_nats_passwords"]
    # Dropping gpu2 revokes it and removes its file; the others keep their passwords.
    assert (
        cli_run([argv[0], "--out", str(out), "--nodes", str(nodes), "--bcrypt-cost", "4"], {}) == 0
    )
    again = json.loads((out / "passwords.json").read_text())["gpufleet_nats_passwords"]
    assert again == {
        k: v
        for k, v in passwords.items()
        if not k.endswith(":gpu2") and not k.startswith(("reader:", "forwarder:"))
    }
    assert not (out / "creds" / f"agent-{POOL}-gpu2.creds").exists()
    assert cli_run(["nats-auth", "--out", str(out), "--node", "nonsense"], {}) == 2


def test_the_server_config_listens_on_loopback_and_refuses_clear_text_beyond(
    tmp_path: Path,
) -> None:
    """The generated config listened on 0.0.0.0 without TLS: passwords in clear."""
    assert 'listen: "127.0.0.1:4222"' in make([]).server_config
    with pytest.raises(NatsAuthError, match="TLS"):
        build([], alert_stream="T", hash_password=fake_hash, listen="0.0.0.0:4222")
    out = tmp_path / "auth"
    base = ["nats-auth", "--out", str(out), "--bcrypt-cost", "4", "--listen", "0.0.0.0:4222"]
    assert cli_run(base, {}) == 2
    cert, key = tmp_path / "server.pem", tmp_path / "server.key"
    made = subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=nats.test", "-keyout", str(key), "-out", str(cert)],
        capture_output=True, timeout=60,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert cli_run([*base, "--tls-cert", str(cert), "--tls-key", str(key)], {}) == 0
    config = (out / "nats-server.conf").read_text()
    assert "tls {" in config and str(cert) in config
    checked = subprocess.run(
        [find_nats_server(), "-t", "-c", str(out / "nats-server.conf")],
        capture_output=True,
        timeout=30,
    )
    assert checked.returncode == 0, checked.stderr


def test_a_cluster_gets_one_config_per_server_routed_to_the_others(tmp_path: Path) -> None:
    """`--cluster` and `--server` write `nats-server-<name>.conf` per server (and no
    single-server config) that nats-server accepts."""
    out = tmp_path / "auth"
    base = ["nats-auth", "--out", str(out), "--bcrypt-cost", "4", "--node", f"{POOL}:gpu1"]
    assert cli_run(base, {}) == 0
    assert (out / "nats-server.conf").is_file()
    servers = [
        "--server", "n1=127.0.0.1:4222,127.0.0.1:6222",
        "--server", "n2=127.0.0.1:4223,127.0.0.1:6223",
        "--server", "n3=localhost:4224,localhost:6224",
    ]  # fmt: skip
    cluster = [*base, "--cluster", "fleet", "--store-dir", "/srv/js", *servers]
    assert cli_run(cluster, {}) == 0
    written = sorted(p.name for p in out.glob("nats-server*.conf"))
    assert written == ["nats-server-n1.conf", "nats-server-n2.conf", "nats-server-n3.conf"]
    n1 = (out / "nats-server-n1.conf").read_text()
    assert n1.splitlines()[1:] == [
        'server_name: "n1"',
        'listen: "127.0.0.1:4222"',
        "jetstream {",
        '  store_dir: "/srv/js/n1"',
        "}",
        "cluster {",
        '  name: "fleet"',
        '  listen: "127.0.0.1:6222"',
        '  routes: ["nats-route://127.0.0.1:6223", "nats-route://localhost:6224"]',
        "}",
        'include "authorization.conf"',
    ]
    for name in written:
        path = out / name
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        checked = subprocess.run(
            [find_nats_server(), "-t", "-c", str(path)], capture_output=True, timeout=30
        )
        assert checked.returncode == 0, checked.stderr
    # Back to one server: the cluster's files go.
    assert cli_run(base, {}) == 0
    assert sorted(p.name for p in out.glob("nats-server*.conf")) == ["nats-server.conf"]


def test_a_cluster_off_loopback_needs_tls_and_its_routes_a_ca(tmp_path: Path) -> None:
    """Routes carry no password: anyone reaching a route port would join the cluster."""
    out = tmp_path / "auth"
    base = ["nats-auth", "--out", str(out), "--bcrypt-cost", "4", "--cluster", "fleet"]
    lan = ["--server", "a=10.0.0.1:4222,10.0.0.1:6222", "--server", "b=10.0.0.2:4222,10.0.0.2:6222"]
    assert cli_run([*base, *lan], {}) == 2  # clear text
    cert, key = tmp_path / "server.pem", tmp_path / "server.key"
    made = subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=nats.test", "-keyout", str(key), "-out", str(cert)],
        capture_output=True, timeout=60,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    tls = ["--tls-cert", str(cert), "--tls-key", str(key)]
    assert cli_run([*base, *lan, *tls], {}) == 2  # routes without a CA
    assert cli_run([*base, *lan, *tls, "--tls-ca", str(cert)], {}) == 0
    a = (out / "nats-server-a.conf").read_text()
    cluster_part = a[a.index("cluster {") :]
    assert f'    ca_file: "{cert}"' in cluster_part and "    verify: true" in cluster_part
    assert "verify" not in a[: a.index("cluster {")]  # clients: only with --tls-verify
    assert 'routes: ["nats-route://10.0.0.2:6222"]' in a
    checked = subprocess.run(
        [find_nats_server(), "-t", "-c", str(out / "nats-server-a.conf")],
        capture_output=True,
        timeout=30,
    )
    assert checked.returncode == 0, checked.stderr
    # Loopback routes and a TLS client listener need no CA.
    mixed = ["--server", "a=10.0.0.1:4222,127.0.0.1:6222"]
    assert cli_run([*base, *mixed, *tls], {}) == 0


def test_cluster_arguments_are_checked() -> None:
    def bundle(cluster: str | None, *servers: str) -> AuthBundle:
        return build(
            [],
            alert_stream="T",
            hash_password=fake_hash,
            cluster=cluster,
            servers=[parse_server_arg(s) for s in servers],
        )

    with pytest.raises(NatsAuthError, match="go together"):
        bundle(None, "a=127.0.0.1:1,127.0.0.1:2")
    with pytest.raises(NatsAuthError, match="go together"):
        bundle("fleet")
    with pytest.raises(NatsAuthError, match="given twice"):
        bundle("fleet", "a=127.0.0.1:1,127.0.0.1:2", "a=127.0.0.1:3,127.0.0.1:4")
    with pytest.raises(NatsAuthError, match="given twice"):
        bundle("fleet", "a=127.0.0.1:1,127.0.0.1:2", "b=127.0.0.1:3,127.0.0.1:2")
    with pytest.raises(NatsAuthError, match="cluster name"):
        bundle("my fleet", "a=127.0.0.1:1,127.0.0.1:2")
    for bad in ("a", "a=127.0.0.1:1", "a=127.0.0.1,127.0.0.1:2", "=127.0.0.1:1,127.0.0.1:2"):
        with pytest.raises(NatsAuthError):
            parse_server_arg(bad)
