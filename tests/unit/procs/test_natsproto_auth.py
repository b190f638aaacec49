"""What the agent's NATS client says in CONNECT for each way of authenticating, and how it
walks its server pool: a `.creds` file's JWT sent and the server's nonce signed with its
seed (verifiable with the user's public key), a password never in a repr, a URL's
`user:password@` used only when nothing else was given, and the servers announced by
INFO joining the pool once each."""

from __future__ import annotations

import base64
import secrets
from pathlib import Path
from urllib.parse import urlsplit

import msgspec
import nkeys
import pytest

from procs.natsproto.auth import Credentials, CredentialsFileError
from procs.natsproto.handshake import Hello, connect_command
from procs.natsproto.servers import RoundRobin, ServerPool


def connect_fields(hello: Hello, url: str, nonce: str | None = None) -> dict[str, object]:
    info = {} if nonce is None else {"nonce": nonce}
    line = connect_command(hello, info, False, urlsplit(url)).split(b"\r\n")[0]
    fields = msgspec.json.decode(line.removeprefix(b"CONNECT "))
    assert isinstance(fields, dict)
    return fields


def test_a_creds_file_sends_its_jwt_and_signs_the_nonce(tmp_path: Path) -> None:
    seed = nkeys.encode_seed(secrets.token_bytes(32), nkeys.PREFIX_BYTE_USER)
    creds = tmp_path / "agent.creds"
    creds.write_text(
        "-----BEGIN NATS USER JWT-----\neyJhbGciOi.jwt.body\n------END NATS USER JWT------\n\n"
        "-----BEGIN USER NKEY SEED-----\n" + seed.decode() + "\n------END USER NKEY SEED------\n"
    )
    hello = Hello("agent", "1", Credentials(creds_path=str(creds)))
    fields = connect_fields(hello, "nats://u:p@h:4222", nonce="abc-nonce")
    assert fields["jwt"] == "eyJhbGciOi.jwt.body"
    assert "user" not in fields  # the URL's credentials only stand in for none
    signature = base64.b64decode(str(fields["sig"]))
    assert nkeys.from_seed(bytearray(seed)).verify(b"abc-nonce", signature)
    creds.write_text("no blocks here\n")
    with pytest.raises(CredentialsFileError, match="no begin nats user jwt block"):
        connect_fields(hello, "nats://h:4222", nonce="n")


def test_a_password_or_the_urls_own_and_never_a_password_in_a_repr() -> None:
    given = Credentials(user="agent", password="s3cret")
    assert "s3cret" not in repr(given) and "s3cret" not in repr(Hello("a", "1", given))
    fields = connect_fields(Hello("a", "1", given), "nats://other:pw@h:4222")
    assert (fields["user"], fields["pass"]) == ("agent", "s3cret")
    from_url = connect_fields(Hello("a", "1"), "nats://fleet:p%40ss@h:4222")
    assert (from_url["user"], from_url["pass"]) == ("fleet", "p@ss")
    assert connect_fields(Hello("a", "1"), "nats://tok3n@h:4222")["auth_token"] == "tok3n"
    bare = connect_fields(Hello("a", "1"), "nats://h:4222")
    assert not {"user", "pass", "auth_token", "jwt"} & set(bare)
    assert (bare["verbose"], bare["pedantic"], bare["protocol"]) == (False, False, 1)


def test_servers_announced_join_the_pool_once_and_rounds_wait() -> None:
    pool = ServerPool(["nats://10.0.0.1:4222", "10.0.0.2:4222"], randomize=False)
    pool.learn({"connect_urls": ["10.0.0.2:4222", "10.0.0.3:4222", "10.0.0.3:4222"]}, False)
    assert [(s.host, s.port, s.discovered) for s in pool.servers] == [
        ("10.0.0.1", 4222, False),
        ("10.0.0.2", 4222, False),
        ("10.0.0.3", 4222, True),
    ]
    choose = RoundRobin(wait_s=2.0)
    picks = [choose(pool.servers, {}) for _ in range(4)]
    assert [(s.host, d) for s, d in picks] == [
        ("10.0.0.1", 0.0),
        ("10.0.0.2", 0.0),
        ("10.0.0.3", 0.0),
        ("10.0.0.1", 2.0),
    ]
