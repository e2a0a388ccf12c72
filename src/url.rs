//! Redis URLs: what a connection needs, and a description of the URL without its secrets.
//!
//! Parsed by hand rather than with the `url` crate, which refuses the multi-host forms of
//! Cluster and Sentinel URLs and passwords pasted without percent-encoding. Redaction is
//! structural and fails closed: the description is rebuilt from the parts that were
//! recognised as not secret, and when the user-info part cannot be delimited with certainty
//! all of it is hidden.
//!
//! Forms:
//!
//! - `redis://[user[:password]@]host[:port][/db]`, `rediss://...` (TLS; `#insecure` skips
//!   certificate checks)
//! - `redis+unix:///path/to/socket[?db=N&user=U&pass=P]` (also `unix://`)
//! - `redis+cluster://[user[:password]@]host:port[,host:port...]`, `rediss+cluster://...`
//! - `redis+sentinel://[user[:password]@]host:port[,host:port...]/master-name[/db]
//!   [?sentinel_user=U&sentinel_pass=P]`, `rediss+sentinel://...`

use std::fmt;
use std::path::PathBuf;

use crate::error::{Error, Result};

/// Where a server listens.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) enum Addr {
    Tcp { host: String, port: u16 },
    Unix(PathBuf),
}

impl fmt::Display for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Addr::Tcp { host, port } if host.contains(':') => write!(f, "[{host}]:{port}"),
            Addr::Tcp { host, port } => write!(f, "{host}:{port}"),
            Addr::Unix(path) => write!(f, "{}", path.display()),
        }
    }
}

impl fmt::Debug for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Whether and how a connection uses TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tls {
    None,
    /// Verify the server's certificate and name.
    Verify,
    /// Encrypt but accept any certificate (`#insecure`).
    Insecure,
}

/// Credentials and database of the data nodes (or of the Sentinels).
#[derive(Clone, Default, PartialEq, Eq)]
pub(crate) struct Login {
    pub username: Option<String>,
    pub password: Option<String>,
    pub db: i64,
}

impl fmt::Debug for Login {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Login")
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("db", &self.db)
            .finish()
    }
}

/// The deployment a URL names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Topology {
    /// One server.
    Single(Addr),
    /// A Redis Cluster, reached first through these seed nodes.
    Cluster(Vec<Addr>),
    /// A primary found through these Sentinels.
    Sentinel {
        sentinels: Vec<Addr>,
        master: String,
        /// How to log in to the Sentinels themselves.
        sentinel_login: Login,
    },
}

/// A parsed URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    pub topology: Topology,
    pub tls: Tls,
    /// How to log in to the data nodes.
    pub login: Login,
    /// The URL with every secret replaced by `***`.
    pub describe: String,
}

/// Parses `url`. Errors are [`crate::ErrorKind::InvalidArgument`] and quote only the
/// redacted URL.
pub(crate) fn parse(url: &str) -> Result<Target> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(Error::invalid(format!(
            "bad Redis URL {}: expected redis://, rediss://, redis+unix://, \
             redis+cluster:// or redis+sentinel://",
            opaque(url)
        )));
    };
    let scheme_lower = scheme.to_ascii_lowercase();
    let kind = match scheme_lower.as_str() {
        "redis" | "rediss" => Kind::Single,
        "redis+unix" | "unix" => Kind::Unix,
        "redis+cluster" | "rediss+cluster" => Kind::Cluster,
        "redis+sentinel" | "rediss+sentinel" => Kind::Sentinel,
        _ => {
            return Err(Error::invalid(format!(
                "bad Redis URL {}: unknown scheme; expected redis://, rediss://, redis+unix://, \
                 redis+cluster:// or redis+sentinel://",
                opaque(url)
            )));
        }
    };
    let tls = if scheme_lower.starts_with("rediss") {
        Tls::Verify
    } else {
        Tls::None
    };
    if kind == Kind::Unix {
        return parse_unix(scheme, rest);
    }
    parse_network(scheme, rest, kind, tls)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Single,
    Unix,
    Cluster,
    Sentinel,
}

/// A URL that could not even be split into parts: shown only when it cannot hold a secret.
fn opaque(url: &str) -> String {
    if url.contains('@') || url.to_ascii_lowercase().contains("pass") {
        "(hidden: it may contain a password)".to_owned()
    } else {
        format!("{url:?}")
    }
}

fn parse_network(scheme: &str, rest: &str, kind: Kind, tls: Tls) -> Result<Target> {
    // The user info ends at the last '@': a password may hold '@', a host never does.
    let (userinfo, hostpart) = match rest.rfind('@') {
        Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
        None => (None, rest),
    };
    // Only a URL with exactly one '@' delimits the user name with certainty.
    let certain = rest.matches('@').count() <= 1;
    let shown_userinfo = match userinfo {
        None => String::new(),
        Some(info) if certain => match info.split_once(':') {
            Some((user, _)) => format!("{user}:***@"),
            None => format!("{info}@"),
        },
        Some(_) => "***@".to_owned(),
    };
    // Until the host part is understood, show nothing but the scheme.
    let hidden = format!(
        "{scheme}://{}",
        if userinfo.is_some() { "***@..." } else { "..." }
    );
    let fail = |why: String| Error::invalid(format!("bad Redis URL {hidden}: {why}"));

    let (hostpart, fragment) = match hostpart.split_once('#') {
        Some((h, f)) => (h, Some(f)),
        None => (hostpart, None),
    };
    let (hostpart, query) = match hostpart.split_once('?') {
        Some((h, q)) => (h, Some(q)),
        None => (hostpart, None),
    };
    let (hosts, path) = match hostpart.find('/') {
        Some(i) => (&hostpart[..i], &hostpart[i + 1..]),
        None => (hostpart, ""),
    };
    let default_port = if kind == Kind::Sentinel { 26379 } else { 6379 };
    let addrs = hosts
        .split(',')
        .map(|h| parse_host_port(h, default_port))
        .collect::<std::result::Result<Vec<_>, String>>()
        .map_err(fail)?;
    if kind == Kind::Single && addrs.len() > 1 {
        return Err(fail(
            "several hosts: use redis+cluster:// or redis+sentinel:// for more than one".into(),
        ));
    }
    let tls = match (tls, fragment) {
        (_, None) => tls,
        (Tls::Verify, Some("insecure")) => Tls::Insecure,
        (_, Some(f)) => {
            return Err(fail(format!(
                "unknown fragment #{f} (only rediss URLs take #insecure)"
            )));
        }
    };

    let mut login = Login::default();
    if let Some(info) = userinfo {
        let (user, pass) = match info.split_once(':') {
            Some((u, p)) => (u, Some(p)),
            None => (info, None),
        };
        if !user.is_empty() {
            login.username = Some(percent_decode(user).map_err(|_| fail("bad user name".into()))?);
        }
        if let Some(p) = pass {
            // A password that is not valid percent-encoding is taken as typed.
            login.password = Some(percent_decode(p).unwrap_or_else(|_| p.to_owned()));
        }
    }

    let mut path_parts = path.split('/').filter(|p| !p.is_empty());
    let mut master = None;
    if kind == Kind::Sentinel {
        let name = path_parts
            .next()
            .ok_or_else(|| fail("a Sentinel URL names the master: .../master-name[/db]".into()))?;
        master = Some(percent_decode(name).map_err(|_| fail("bad master name".into()))?);
    }
    if let Some(db) = path_parts.next() {
        login.db = db
            .parse::<i64>()
            .ok()
            .filter(|d| *d >= 0)
            .ok_or_else(|| fail(format!("the database {db:?} is not a number")))?;
        if kind == Kind::Cluster && login.db != 0 {
            return Err(fail("a Redis Cluster has only database 0".into()));
        }
    }
    if let Some(extra) = path_parts.next() {
        return Err(fail(format!("unexpected path segment {extra:?}")));
    }

    let mut sentinel_login = Login::default();
    let mut shown_query = Vec::new();
    if let Some(query) = query.filter(|q| !q.is_empty()) {
        for (name, value) in split_query(query, &["sentinel_user", "sentinel_pass"]) {
            match (kind, name) {
                (Kind::Sentinel, "sentinel_user") => {
                    shown_query.push(format!("sentinel_user={value}"));
                    sentinel_login.username =
                        Some(percent_decode(value).map_err(|_| fail("bad sentinel_user".into()))?);
                }
                (Kind::Sentinel, "sentinel_pass") => {
                    shown_query.push("sentinel_pass=***".into());
                    sentinel_login.password =
                        Some(percent_decode(value).unwrap_or_else(|_| value.to_owned()));
                }
                _ => {
                    return Err(fail(format!(
                        "unknown query parameter {name:?}{}",
                        if kind == Kind::Sentinel {
                            " (Sentinel URLs take sentinel_user and sentinel_pass)"
                        } else {
                            ""
                        }
                    )));
                }
            }
        }
    }

    let mut describe = format!("{scheme}://{shown_userinfo}{hosts}");
    if !path.is_empty() {
        describe.push('/');
        describe.push_str(path);
    }
    if !shown_query.is_empty() {
        describe.push('?');
        describe.push_str(&shown_query.join("&"));
    }
    if let Some(f) = fragment {
        describe.push('#');
        describe.push_str(f);
    }
    let topology = match kind {
        Kind::Single => Topology::Single(
            addrs
                .into_iter()
                .next()
                .ok_or_else(|| fail("no host".into()))?,
        ),
        Kind::Cluster => Topology::Cluster(addrs),
        _ => Topology::Sentinel {
            sentinels: addrs,
            master: master.unwrap_or_default(),
            sentinel_login,
        },
    };
    Ok(Target {
        topology,
        tls,
        login,
        describe,
    })
}

/// `host[:port]` or `[v6]:port`.
fn parse_host_port(text: &str, default_port: u16) -> std::result::Result<Addr, String> {
    let (host, port) = if let Some(v6) = text.strip_prefix('[') {
        let (host, after) = v6
            .split_once(']')
            .ok_or_else(|| format!("unclosed '[' in host {text:?}"))?;
        match after {
            "" => (host, None),
            _ => (
                host,
                Some(
                    after
                        .strip_prefix(':')
                        .ok_or_else(|| format!("bad host {text:?}"))?,
                ),
            ),
        }
    } else {
        match text.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (text, None),
        }
    };
    if host.is_empty() {
        return Err("no host".into());
    }
    if !host
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-._:%".contains(&b))
    {
        return Err(format!("bad host {host:?}"));
    }
    let port = match port {
        None => default_port,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("bad port {p:?}"))?,
    };
    Ok(Addr::Tcp {
        host: host.to_owned(),
        port,
    })
}

fn parse_unix(scheme: &str, rest: &str) -> Result<Target> {
    const KNOWN: [&str; 5] = ["db", "user", "username", "pass", "password"];
    // `redis+unix://user:pass@/path` (as some clients write it): the user info ends at the
    // last "@/"; any other '@' before the path leaves its extent unknown: hide it all.
    let (userinfo, rest) = match rest.rfind("@/") {
        Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
        None => (None, rest),
    };
    if userinfo.is_none() && rest.split('?').next().is_some_and(|p| p.contains('@')) {
        return Err(Error::invalid(format!(
            "bad Redis URL {scheme}://***: expected redis+unix:///path[?db=N&user=U&pass=P]"
        )));
    }
    let (path, query) = match rest.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (rest, None),
    };
    let mut shown = Vec::new();
    let mut login = Login::default();
    let mut shown_userinfo = String::new();
    if let Some(info) = userinfo {
        let (user, pass) = match info.split_once(':') {
            Some((u, p)) => (u, Some(p)),
            None => (info, None),
        };
        if !user.is_empty() {
            login.username = percent_decode(user).ok();
        }
        if let Some(p) = pass {
            login.password = Some(percent_decode(p).unwrap_or_else(|_| p.to_owned()));
        }
        let certain = !info.contains('@');
        shown_userinfo = match (certain, pass) {
            (true, Some(_)) => format!("{user}:***@"),
            (true, None) => format!("{user}@"),
            (false, _) => "***@".to_owned(),
        };
    }
    let mut problem = None;
    for (name, value) in query.map(|q| split_query(q, &KNOWN)).unwrap_or_default() {
        match name {
            "db" => {
                shown.push(format!("db={value}"));
                match value.parse::<i64>().ok().filter(|d| *d >= 0) {
                    Some(db) => login.db = db,
                    None => problem = Some(format!("the database {value:?} is not a number")),
                }
            }
            "user" | "username" => {
                shown.push(format!("{name}={value}"));
                login.username = percent_decode(value).ok();
            }
            "pass" | "password" => {
                shown.push(format!("{name}=***"));
                login.password = Some(percent_decode(value).unwrap_or_else(|_| value.to_owned()));
            }
            _ => {
                shown.push("***".into());
                problem.get_or_insert_with(|| {
                    "unknown query parameter (unix URLs take db, user and pass)".into()
                });
            }
        }
    }
    let mut describe = format!("{scheme}://{shown_userinfo}{path}");
    if !shown.is_empty() {
        describe.push('?');
        describe.push_str(&shown.join("&"));
    }
    if let Some(why) = problem {
        return Err(Error::invalid(format!("bad Redis URL {describe}: {why}")));
    }
    if !path.starts_with('/') || path.len() < 2 {
        return Err(Error::invalid(format!(
            "bad Redis URL {describe}: expected an absolute socket path (redis+unix:///path)"
        )));
    }
    let path = percent_decode(path)
        .map_err(|_| Error::invalid(format!("bad Redis URL {describe}: bad socket path")))?;
    Ok(Target {
        topology: Topology::Single(Addr::Unix(PathBuf::from(path))),
        tls: Tls::None,
        login,
        describe,
    })
}

/// Splits a query string into `name=value` pairs. A value runs until the next `&` that
/// starts a known parameter (`known`), so a password holding `&` or `=` stays whole; an
/// unknown parameter name is returned as such (and refused by the caller).
fn split_query<'a>(query: &'a str, known: &[&str]) -> Vec<(&'a str, &'a str)> {
    let starts_param = |at: usize| {
        let tail = &query[at..];
        known
            .iter()
            .any(|k| tail.strip_prefix(k).is_some_and(|t| t.starts_with('=')))
    };
    let mut cuts = vec![0];
    for (i, b) in query.bytes().enumerate() {
        if b == b'&' && starts_param(i + 1) {
            cuts.push(i + 1);
        }
    }
    cuts.push(query.len() + 1);
    cuts.windows(2)
        .map(|w| {
            let part = &query[w[0]..w[1] - 1];
            match part.split_once('=') {
                Some((name, value)) if known.contains(&name) => (name, value),
                // An unknown name: hand back a marker the caller refuses.
                _ => ("?", ""),
            }
        })
        .collect()
}

/// Decodes `%XX` escapes; errors on a bad escape or a result that is not UTF-8.
fn percent_decode(text: &str) -> std::result::Result<String, ()> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3).ok_or(())?;
            let hex = std::str::from_utf8(hex).map_err(|_| ())?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| ())?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn single(url: &str) -> (Addr, Login, String) {
        let t = parse(url).unwrap();
        match t.topology {
            Topology::Single(a) => (a, t.login, t.describe),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn parses_single_server_urls() {
        let (addr, login, describe) = single("redis://alice:s3cret@host:1234/5");
        assert_eq!(
            addr,
            Addr::Tcp {
                host: "host".into(),
                port: 1234
            }
        );
        assert_eq!(login.username.as_deref(), Some("alice"));
        assert_eq!(login.password.as_deref(), Some("s3cret"));
        assert_eq!(login.db, 5);
        assert_eq!(describe, "redis://alice:***@host:1234/5");
        let (addr, login, _) = single("redis://[::1]");
        assert_eq!(
            addr,
            Addr::Tcp {
                host: "::1".into(),
                port: 6379
            }
        );
        assert_eq!(login, Login::default());
        assert_eq!(parse("rediss://h#insecure").unwrap().tls, Tls::Insecure);
        assert_eq!(parse("rediss://h").unwrap().tls, Tls::Verify);
        assert_eq!(parse("redis://h").unwrap().tls, Tls::None);
        let (addr, login, describe) = single("redis+unix:///tmp/r.sock?db=2&user=u&pass=a&b=c");
        assert_eq!(addr, Addr::Unix("/tmp/r.sock".into()));
        assert_eq!(login.password.as_deref(), Some("a&b=c"));
        assert_eq!(login.db, 2);
        assert_eq!(describe, "redis+unix:///tmp/r.sock?db=2&user=u&pass=***");
    }

    #[test]
    fn parses_cluster_and_sentinel_urls() {
        let t = parse("redis+cluster://:pw@a:1,b:2").unwrap();
        assert_eq!(t.describe, "redis+cluster://:***@a:1,b:2");
        assert!(matches!(&t.topology, Topology::Cluster(seeds) if seeds.len() == 2));
        let t = parse("redis+sentinel://:pw@a,b:26380/mymaster/3?sentinel_pass=sp%40").unwrap();
        assert_eq!(
            t.describe,
            "redis+sentinel://:***@a,b:26380/mymaster/3?sentinel_pass=***"
        );
        match t.topology {
            Topology::Sentinel {
                sentinels,
                master,
                sentinel_login,
            } => {
                assert_eq!(sentinels.len(), 2);
                assert_eq!(master, "mymaster");
                assert_eq!(sentinel_login.password.as_deref(), Some("sp@"));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(t.login.db, 3);
        assert!(parse("redis+sentinel://a:1").is_err(), "no master name");
        assert!(parse("redis+cluster://a:1/2").is_err(), "cluster db");
        assert!(parse("redis://a:1,b:2").is_err());
    }

    /// Passwords as people paste them: never in a description or an error.
    #[test]
    fn awkward_passwords_never_appear() {
        for pw in [
            "Qx7-pa/zz9w0rd",
            "p#ss",
            "p?ss",
            "p@ss",
            "p:ss",
            "p%zzss",
            "a/b?c#d@e",
            "::@@//",
            "p ss",
            "ünï/cødé",
        ] {
            for url in [
                format!("redis://:{pw}@127.0.0.1:6379/0"),
                format!("redis://alice:{pw}@127.0.0.1:6379"),
                format!("rediss://u:{pw}@host/1#insecure"),
                format!("redis+cluster://:{pw}@a:1,b:2"),
                format!("redis+sentinel://:{pw}@a:1/m?sentinel_pass={pw}"),
                format!("redis+unix:///tmp/s?pass={pw}&db=1"),
                format!("redis+unix:///tmp/s?db=x&pass={pw}"),
                format!("redis+unix://:{pw}@/tmp/redis.sock"),
                format!("redis+unix://u:{pw}@relative"),
                format!("redis://:{pw}@[::1"),
                format!("bogus://:{pw}@h"),
                format!(":{pw}@h"),
            ] {
                let shown = match parse(&url) {
                    Ok(t) => t.describe,
                    Err(e) => e.to_string(),
                };
                assert!(!shown.contains(pw), "{url} -> {shown}");
                // No long run of the password either.
                if pw.len() >= 6 {
                    for w in pw.as_bytes().windows(5) {
                        let w = String::from_utf8_lossy(w);
                        assert!(!shown.contains(w.as_ref()), "{url} -> {shown} has {w}");
                    }
                }
            }
        }
    }

    #[test]
    fn rejects_malformed_urls() {
        for url in [
            "",
            "localhost:6379",
            "http://127.0.0.1:6379",
            "redis://127.0.0.1:6379/notadb",
            "redis://",
            "redis://:pw@[::1",
            "redis://h:0",
            "redis://h:99999",
            "redis://h/1/2",
            "redis://h?x=1",
            "redis://h#insecure",
            "redis+unix://relative",
            "redis+unix:///tmp/s?bogus=1",
        ] {
            assert!(parse(url).is_err(), "{url:?} was accepted");
        }
    }
}
