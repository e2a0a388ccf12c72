"""The redlease client for a redis-py client: :meth:`redlease.Client.from_redis`.

What a redis-py client knows of its server (a ``redis.Redis``, its ``ConnectionPool``, a
``Sentinel(...).master_for(name)`` client, a ``RedisCluster``, or their ``redis.asyncio``
twins) becomes a redlease URL and options. Nothing here imports redis-py: its objects are
read by their attributes, so that the package keeps working without it installed.
"""

import ssl
import threading
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple
from urllib.parse import quote

from ._errors import InvalidArgumentError

# One redlease client per redis-py pool (or cluster), made on first use and reused; it
# goes (and is closed) with the pool.
_CLIENTS: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()
_CLIENTS_LOCK = threading.Lock()

def client_for(source: object, factory: Callable[..., Any]) -> Any:
    """The redlease client for ``source``'s server, made with ``factory(url, **options)``
    on first use and reused while the pool lives. Raises :class:`InvalidArgumentError`
    naming what cannot be carried over (a custom connection class, a credential provider,
    a client certificate, TLS without verification, ...)."""
    owner = _owner(source)
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(owner)
        if client is not None and client._handle:
            return client
    url, options = describe(source)
    client = factory(url, **options)
    client._shared = True  # close() leaves it open for the pool's other users
    with _CLIENTS_LOCK:
        # Another thread may have made one meanwhile: keep the first, close ours.
        first = _CLIENTS.setdefault(owner, client)
        if first is not client and first._handle:
            client._close_now()
            return first
        _CLIENTS[owner] = client
    return client


def _owner(source: object) -> object:
    """What a redlease client is kept for: the pool of a client, the cluster itself."""
    if _is_cluster(source):
        return source
    pool = getattr(source, "connection_pool", None)
    if pool is not None:
        return pool
    if hasattr(source, "connection_kwargs"):
        return source
    raise InvalidArgumentError(
        f"from_redis takes a redis.Redis, a redis.ConnectionPool, a Sentinel master client or a "
        f"RedisCluster (or their redis.asyncio twins), not {type(source).__name__}"
    )


def _is_cluster(source: object) -> bool:
    return hasattr(source, "nodes_manager") and hasattr(source.nodes_manager, "startup_nodes")


def describe(source: object) -> Tuple[str, Dict[str, Any]]:
    """The redlease URL and client options for ``source``'s server."""
    if _is_cluster(source):
        return _cluster(source)
    pool = _owner(source)
    kwargs = dict(getattr(pool, "connection_kwargs", {}))
    connection_class = getattr(pool, "connection_class", None)
    class_name = getattr(connection_class, "__name__", "")
    sentinel = getattr(pool, "sentinel_manager", None)
    tls = "SSL" in class_name
    _refuse_uncarried(kwargs, connection_class, tls)
    options = _timeouts(kwargs)
    if tls:
        options.update(_tls(kwargs))
    encoding = kwargs.get("encoding") or "utf-8"
    login = _login(kwargs.get("username"), kwargs.get("password"), encoding)
    db = int(kwargs.get("db") or 0)
    if sentinel is not None:
        if not getattr(pool, "is_master", True):
            raise InvalidArgumentError(
                "from_redis takes a Sentinel master client (master_for), not a replica client "
                "(slave_for): locks are taken on the primary"
            )
        return _sentinel(pool, sentinel, login, db, tls), options
    if "UnixDomainSocket" in class_name:
        query = [f"db={db}"]
        if kwargs.get("username"):
            query.append("user=" + quote(_text(kwargs["username"], encoding), safe=""))
        if kwargs.get("password"):
            query.append("pass=" + quote(_text(kwargs["password"], encoding), safe=""))
        path = quote(_text(kwargs["path"]), safe="/")
        return f"redis+unix://{path}?{'&'.join(query)}", options
    scheme = "rediss" if tls else "redis"
    host, port = kwargs.get("host", "localhost"), int(kwargs.get("port", 6379))
    return f"{scheme}://{login}{_host(host)}:{port}/{db}", options


def _redis_py_connection_classes() -> Tuple[type, ...]:
    """redis-py's own connection classes, sync and asyncio: the ones redlease can stand
    in for (by identity: a class of the caller's with the same name is not one of them)."""
    import importlib

    found = []
    for module, names in (
        ("redis.connection", ("Connection", "SSLConnection", "UnixDomainSocketConnection")),
        ("redis.sentinel", ("SentinelManagedConnection", "SentinelManagedSSLConnection")),
        ("redis.asyncio.connection", ("Connection", "SSLConnection", "UnixDomainSocketConnection")),
        ("redis.asyncio.sentinel", ("SentinelManagedConnection", "SentinelManagedSSLConnection")),
    ):
        try:
            loaded = importlib.import_module(module)
        except ImportError:
            continue
        found.extend(c for c in (getattr(loaded, n, None) for n in names) if isinstance(c, type))
    return tuple(found)


def _refuse_uncarried(kwargs: Dict[str, Any], connection_class: Optional[type], tls: bool) -> None:
    """Raises naming the first argument redlease cannot honour (``tls``: the connections
    are TLS ones). Arguments that change nothing a lock does (encodings, retries, health
    checks, client names) are ignored."""
    if connection_class is not None and connection_class not in _redis_py_connection_classes():
        raise InvalidArgumentError(
            f"from_redis cannot carry the connection class "
            f"{getattr(connection_class, '__qualname__', connection_class)!s} (of "
            f"{getattr(connection_class, '__module__', '?')}): redlease opens its own "
            f"connections (use redlease.Client with a URL)"
        )
    if kwargs.get("credential_provider") is not None:
        raise InvalidArgumentError(
            "from_redis cannot carry a credential_provider: redlease needs the username and "
            "password themselves (use redlease.Client with a URL)"
        )
    for name in ("ssl_certfile", "ssl_keyfile", "ssl_ca_path", "ssl_ca_data"):
        if kwargs.get(name):
            raise InvalidArgumentError(
                f"from_redis cannot carry {name}: redlease verifies the server with a CA file "
                f"(ssl_ca_certs) and sends no client certificate"
            )
    reqs = kwargs.get("ssl_cert_reqs", "required")
    if tls and reqs not in ("required", ssl.CERT_REQUIRED):
        raise InvalidArgumentError(
            f"from_redis cannot carry ssl_cert_reqs={reqs!r}: redlease always verifies the "
            f"server's certificate"
        )
    if tls and kwargs.get("ssl_check_hostname") is False:
        raise InvalidArgumentError(
            "from_redis cannot carry ssl_check_hostname=False: redlease always checks the "
            "server's name"
        )


def _timeouts(kwargs: Dict[str, Any]) -> Dict[str, Any]:
    options: Dict[str, Any] = {}
    if kwargs.get("socket_connect_timeout") is not None:
        options["connect_timeout"] = float(kwargs["socket_connect_timeout"])
    elif kwargs.get("socket_timeout") is not None:
        options["connect_timeout"] = float(kwargs["socket_timeout"])
    if kwargs.get("socket_timeout") is not None:
        options["io_timeout"] = float(kwargs["socket_timeout"])
    return options


def _tls(kwargs: Dict[str, Any]) -> Dict[str, Any]:
    ca = kwargs.get("ssl_ca_certs")
    return {"tls_ca_cert_file": ca} if ca else {}


def _text(value: object, encoding: str = "utf-8") -> str:
    """A redis-py argument as text: ``bytes`` (which redis-py accepts for credentials) are
    decoded."""
    return value.decode(encoding) if isinstance(value, bytes) else str(value)


def _login(username: object, password: object, encoding: str = "utf-8") -> str:
    """``user:pass@`` for a URL, percent-encoded; empty without a password."""
    if not password and not username:
        return ""
    user = quote(_text(username, encoding), safe="") if username else ""
    if password:
        return f"{user}:{quote(_text(password, encoding), safe='')}@"
    return f"{user}@"


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _sentinel(pool: Any, manager: Any, login: str, db: int, tls: bool) -> str:
    """A ``redis+sentinel://`` URL for a Sentinel master pool."""
    addresses: List[str] = []
    sentinel_login: Optional[Tuple[object, object]] = None
    for s in manager.sentinels:
        sk = getattr(getattr(s, "connection_pool", None), "connection_kwargs", {})
        addresses.append(f"{_host(sk.get('host', 'localhost'))}:{int(sk.get('port', 26379))}")
        if sentinel_login is None:
            sentinel_login = (sk.get("username"), sk.get("password"))
    if not addresses:
        raise InvalidArgumentError("the Sentinel client has no sentinel addresses")
    query = []
    if sentinel_login and sentinel_login[1]:
        if sentinel_login[0]:
            query.append("sentinel_user=" + quote(_text(sentinel_login[0]), safe=""))
        query.append("sentinel_pass=" + quote(_text(sentinel_login[1]), safe=""))
    scheme = "rediss+sentinel" if tls else "redis+sentinel"
    url = f"{scheme}://{login}{','.join(addresses)}/{quote(_text(pool.service_name), safe='')}/{db}"
    return url + (f"?{'&'.join(query)}" if query else "")


def _cluster(cluster: Any) -> Tuple[str, Dict[str, Any]]:
    """A ``redis+cluster://`` URL for a cluster client's startup nodes."""
    manager = cluster.nodes_manager
    kwargs = dict(getattr(manager, "connection_kwargs", {}) or {})
    nodes = list(manager.startup_nodes.values())
    if not nodes:
        raise InvalidArgumentError("the cluster client has no startup nodes")
    connection_class = kwargs.pop("connection_class", None)
    class_name = getattr(connection_class, "__name__", "")
    tls = bool(kwargs.get("ssl")) or "SSL" in class_name
    _refuse_uncarried({k: v for k, v in kwargs.items() if k != "ssl"}, connection_class, tls)
    options = _timeouts(kwargs)
    if tls:
        options.update(_tls(kwargs))
    login = _login(kwargs.get("username"), kwargs.get("password"))
    hosts = ",".join(f"{_host(n.host)}:{int(n.port)}" for n in nodes)
    return f"{'rediss' if tls else 'redis'}+cluster://{login}{hosts}", options
