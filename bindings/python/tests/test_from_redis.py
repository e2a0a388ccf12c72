"""Client.from_redis: a redlease client for the server a redis-py client talks to, against
real servers (a plain one, a unix socket, one with a password, Sentinel, Cluster)."""

import os
import signal
import subprocess
import time

import pytest
import redis
import redis.asyncio
import redis.cluster
import redis.sentinel

import redlease
import redlease.redis_py as rp
from conftest import RedisServer, _free_port


def holds(r, name: str, lk) -> bool:
    """Whether ``name`` holds ``lk``'s token, read through redis-py."""
    value = r.get(name)
    if isinstance(value, bytes):
        value = value.decode()
    return value == lk.token


def test_a_redis_client_gives_its_host_port_and_db(server):
    r = redis.Redis(host="127.0.0.1", port=server.port, db=3, socket_timeout=4, socket_connect_timeout=1.5)
    client = redlease.Client.from_redis(r)
    assert client.url == f"redis://127.0.0.1:{server.port}/3"
    with client.acquire("job") as lk:
        assert holds(r, "job", lk)
        assert redis.Redis(host="127.0.0.1", port=server.port, db=0).get("job") is None


def test_one_client_per_pool_reused(server):
    pool = redis.ConnectionPool(host="127.0.0.1", port=server.port)
    a, b = redis.Redis(connection_pool=pool), redis.Redis(connection_pool=pool)
    assert redlease.Client.from_redis(a) is redlease.Client.from_redis(b)
    assert redlease.Client.from_redis(pool) is redlease.Client.from_redis(a)
    other = redis.Redis(host="127.0.0.1", port=server.port)
    assert redlease.Client.from_redis(other) is not redlease.Client.from_redis(a)


def test_closing_the_shared_client_releases_nobody_elses_lock(server):
    """Every user of a pool shares its client: one user's `with ... as c:` must not release
    the locks the others hold through it (the compatible locks among them)."""
    r = redis.Redis(host="127.0.0.1", port=server.port)
    lock = r.lock("shared", lock_class=rp.Lock, timeout=30)
    assert lock.acquire(blocking=False)
    with redlease.Client.from_redis(r) as c:
        c.acquire("mine", wait=0).release()
    assert lock.owned() and not lock.lost.is_set()
    assert redlease.Client.from_redis(r) is c  # still the same, still open
    lock.release()
    c._close_now()  # what the pool's collection does
    again = redlease.Client.from_redis(r)
    assert again is not c
    again.acquire("x", wait=0).release()


def test_bytes_credentials_and_odd_unix_paths_are_carried(tmp_path):
    odd = tmp_path / "a b?#%41"
    odd.mkdir()
    sock = odd / "r.sock"
    srv = RedisServer(tmp_path, "--unixsocket", str(sock), "--requirepass", "pw")
    try:
        r = redis.Redis(unix_socket_path=str(sock), password=b"pw")
        with redlease.Client.from_redis(r).acquire("job", wait=0) as lk:
            assert holds(r, "job", lk)
        tcp = redis.Redis(host="127.0.0.1", port=srv.port, username=b"default", password=b"pw")
        with redlease.Client.from_redis(tcp).acquire("job2", wait=0) as lk:
            assert holds(tcp, "job2", lk)
    finally:
        srv.stop()


def test_a_password_and_username_are_carried(tmp_path):
    srv = RedisServer(tmp_path, "--requirepass", "s3cr:t/@pw")
    try:
        r = redis.Redis(host="127.0.0.1", port=srv.port, password="s3cr:t/@pw")
        client = redlease.Client.from_redis(r)
        assert "s3cr" not in client.url
        with client.acquire("job") as lk:
            assert holds(r, "job", lk)
        wrong = redis.Redis(host="127.0.0.1", port=srv.port, password="wrong")
        with pytest.raises(redlease.RedleaseError):
            redlease.Client.from_redis(wrong).acquire("job", wait=0)
    finally:
        srv.stop()


def test_a_unix_socket_is_carried(tmp_path):
    sock = tmp_path / "redis.sock"
    srv = RedisServer(tmp_path, "--unixsocket", str(sock), "--unixsocketperm", "700")
    try:
        r = redis.Redis(unix_socket_path=str(sock), db=2)
        client = redlease.Client.from_redis(r)
        assert client.url.startswith("redis+unix://")
        with client.acquire("job") as lk:
            assert holds(r, "job", lk)
    finally:
        srv.stop()


def test_an_asyncio_client_is_carried(server):
    r = redis.asyncio.Redis(host="127.0.0.1", port=server.port, db=1)
    client = redlease.Client.from_redis(r)
    assert client.url == f"redis://127.0.0.1:{server.port}/1"


def test_what_cannot_be_carried_is_refused_by_name(server):
    class MyConnection(redis.Connection):
        pass

    custom = redis.Redis(connection_pool=redis.ConnectionPool(
        connection_class=MyConnection, host="127.0.0.1", port=server.port))
    with pytest.raises(redlease.InvalidArgumentError, match="MyConnection"):
        redlease.Client.from_redis(custom)

    class Connection(redis.Connection):  # named as redis-py's own: still the caller's
        pass

    same_name = redis.Redis(connection_pool=redis.ConnectionPool(
        connection_class=Connection, host="127.0.0.1", port=server.port))
    with pytest.raises(redlease.InvalidArgumentError, match="connection class"):
        redlease.Client.from_redis(same_name)

    provider = redis.UsernamePasswordCredentialProvider("u", "p")
    with pytest.raises(redlease.InvalidArgumentError, match="credential_provider"):
        redlease.Client.from_redis(redis.Redis(host="127.0.0.1", port=server.port,
                                               credential_provider=provider))
    with pytest.raises(redlease.InvalidArgumentError, match="ssl_cert_reqs"):
        redlease.Client.from_redis(redis.Redis(host="127.0.0.1", port=server.port, ssl=True,
                                               ssl_cert_reqs="none"))
    with pytest.raises(redlease.InvalidArgumentError, match="ssl_certfile"):
        redlease.Client.from_redis(redis.Redis(host="127.0.0.1", port=server.port, ssl=True,
                                               ssl_certfile="/nonexistent.pem"))
    with pytest.raises(redlease.InvalidArgumentError, match="not dict"):
        redlease.Client.from_redis({"host": "127.0.0.1"})


# --- Sentinel ----------------------------------------------------------------------------


class Sentinel:
    """A sentinel process watching a primary as ``mymaster``."""

    def __init__(self, tmp_path, primary_port: int) -> None:
        self.port = _free_port()
        conf = tmp_path / "sentinel.conf"
        conf.write_text(
            f"port {self.port}\nbind 127.0.0.1\ndir {tmp_path}\n"
            f"sentinel monitor mymaster 127.0.0.1 {primary_port} 1\n"
        )
        binary = os.environ.get("REDIS_SERVER_BIN") or "redis-server"
        self.proc = subprocess.Popen(
            [binary, str(conf), "--sentinel", "--logfile", str(tmp_path / "sentinel.log")],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                s = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1)
                if s.sentinel_get_master_addr_by_name("mymaster"):
                    return
            except redis.exceptions.RedisError:
                pass
            time.sleep(0.05)
        self.stop()
        pytest.fail("the sentinel did not start")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def test_a_sentinel_master_client_is_carried(server, tmp_path):
    sentinel = Sentinel(tmp_path, server.port)
    try:
        master = redis.sentinel.Sentinel([("127.0.0.1", sentinel.port)], socket_timeout=2).master_for(
            "mymaster", db=0)
        client = redlease.Client.from_redis(master)
        assert client.url.startswith(f"redis+sentinel://127.0.0.1:{sentinel.port}/mymaster")
        with client.acquire("job") as lk:
            assert holds(server.redis(), "job", lk)
        lock = master.lock("compat", lock_class=rp.Lock, timeout=5)
        assert lock.acquire(blocking=False)
        assert lock.owned()
        lock.release()
        replica = redis.sentinel.Sentinel([("127.0.0.1", sentinel.port)]).slave_for("mymaster")
        with pytest.raises(redlease.InvalidArgumentError, match="slave_for"):
            redlease.Client.from_redis(replica)
    finally:
        sentinel.stop()


# --- Cluster -----------------------------------------------------------------------------


@pytest.fixture
def cluster(tmp_path):
    nodes = []
    try:
        for i in range(3):
            d = tmp_path / f"node{i}"
            d.mkdir()
            nodes.append(RedisServer(d, "--cluster-enabled", "yes", "--cluster-config-file",
                                     str(d / "nodes.conf")))
        addresses = [f"127.0.0.1:{n.port}" for n in nodes]
        subprocess.run(["redis-cli", "--cluster", "create", *addresses, "--cluster-replicas", "0",
                        "--cluster-yes"], check=True, capture_output=True, timeout=60)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if all(n.redis().cluster("info").get("cluster_state") == "ok" for n in nodes):
                break
            time.sleep(0.1)
        else:
            pytest.fail("the cluster did not become ready")
        yield nodes
    finally:
        for n in nodes:
            n.stop()


def test_a_cluster_client_gives_its_startup_nodes(cluster):
    rc = redis.cluster.RedisCluster(host="127.0.0.1", port=cluster[0].port)
    try:
        client = redlease.Client.from_redis(rc)
        assert client.url.startswith("redis+cluster://127.0.0.1:")
        assert redlease.Client.from_redis(rc) is client
        for name in ("a", "b", "c", "d"):  # names on different slots and nodes
            with client.acquire(name) as lk:
                assert holds(rc, name, lk)
        lock = rc.lock("compat", lock_class=rp.Lock, timeout=5)
        assert lock.acquire(blocking=False)
        assert lock.owned() and lock.locked()
        lock.release()
        assert not lock.locked()
    finally:
        rc.close()


# --- TLS ---------------------------------------------------------------------------------


def test_tls_and_its_ca_file_are_carried(tmp_path):
    def openssl(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    p = {name: str(tmp_path / name) for name in ("ca.pem", "ca.key", "cert.pem", "key.pem", "req.csr")}
    (tmp_path / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
            "/CN=redlease-test-ca", "-keyout", p["ca.key"], "-out", p["ca.pem"])
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost",
            "-keyout", p["key.pem"], "-out", p["req.csr"])
    openssl("x509", "-req", "-days", "1", "-in", p["req.csr"], "-CA", p["ca.pem"], "-CAkey",
            p["ca.key"], "-CAcreateserial", "-out", p["cert.pem"], "-extfile", str(tmp_path / "san.ext"))
    tls_port = _free_port()
    srv = RedisServer(tmp_path, "--tls-port", str(tls_port), "--tls-cert-file", p["cert.pem"],
                      "--tls-key-file", p["key.pem"], "--tls-auth-clients", "no")
    try:
        r = redis.Redis(host="127.0.0.1", port=tls_port, ssl=True, ssl_ca_certs=p["ca.pem"])
        client = redlease.Client.from_redis(r)
        assert client.url == f"rediss://127.0.0.1:{tls_port}/0"
        with client.acquire("job") as lk:
            assert holds(r, "job", lk)
        unverified = redis.Redis(host="127.0.0.1", port=tls_port, ssl=True)
        with pytest.raises(redlease.RedleaseError):
            # No CA file: the server's certificate is checked against the system's CAs.
            redlease.Client.from_redis(unverified).acquire("job", wait=0)
    finally:
        srv.stop()


def test_an_acl_user_is_carried(tmp_path):
    srv = RedisServer(tmp_path)
    try:
        srv.redis().execute_command("ACL", "SETUSER", "locker", "on", ">pw", "~*", "+@all")
        r = redis.Redis(host="127.0.0.1", port=srv.port, username="locker", password="pw")
        client = redlease.Client.from_redis(r)
        assert "locker" in client.url and "pw" not in client.url.replace("locker", "")
        with client.acquire("job") as lk:
            assert holds(r, "job", lk)
    finally:
        srv.stop()


def test_the_socket_timeout_bounds_every_call(server):
    """A server that stops answering: the acquire fails after about the redis-py client's
    socket_timeout (0.3 s), not redlease's default of 2 s."""
    r = redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=0.3)
    client = redlease.Client.from_redis(r)
    client.acquire("warm", wait=0).release()  # connected before the server stops
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        start = time.monotonic()
        with pytest.raises(redlease.RedisConnectionError):
            client.acquire("job", wait=0)
        took = time.monotonic() - start
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
    assert 0.25 <= took < 1.5, took
