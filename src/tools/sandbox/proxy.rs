//! The network allowlist of a run (`network = ["registry.npmjs.org", "*.crates.io",
//! "localhost:8080"]`): its host patterns, and the HTTP proxy that is the only way out of a
//! jail with a network namespace of its own. The proxy accepts on a socket made inside that
//! namespace (its loopback), passes CONNECT and absolute-form HTTP requests to listed hosts
//! and refuses the rest with a `403` naming the host and the key; each refusal is reported
//! (to the run's events). The host's loopback is reached only when a loopback host is listed
//! with that port, whatever name the request used.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One entry of `network = [...]`: `host` (ports 80 and 443), `host:port`, `*.domain`
/// (its subdomains), `[::1]:port`; names are compared without case.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostPattern {
    host: String,
    wildcard: bool,
    port: Option<u16>,
}

const LOOPBACK_NAMES: &[&str] = &["localhost", "127.0.0.1", "::1"];

fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        })
}

/// `host`, `host:port`, `[v6]` or `[v6]:port` as host (lower case, no brackets) and port.
fn split_authority(s: &str) -> Option<(String, Option<u16>)> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (v6, after) = rest.split_once(']')?;
        v6.parse::<Ipv6Addr>().ok()?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':')?),
        };
        (v6.to_string(), port)
    } else {
        match s.split_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (s.to_string(), None),
        }
    };
    let port = match port {
        Some(p) => Some(p.parse::<u16>().ok().filter(|p| *p != 0)?),
        None => None,
    };
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    Some((host, port))
}

impl HostPattern {
    pub fn parse(given: &str) -> Result<HostPattern, String> {
        let bad = |why: &str| {
            format!(
                "`{given}` is not a host pattern ({why}): write `host` (ports 80 and 443), \
                 `host:port` or `*.domain` (its subdomains), e.g. \"*.crates.io\""
            )
        };
        let s = given.trim();
        if s.contains("://") || s.contains('/') {
            return Err(bad("a host alone, without scheme or path"));
        }
        let (wildcard, rest) = match s.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, s),
        };
        let (host, port) = split_authority(rest).ok_or_else(|| bad("bad port or address"))?;
        let ip = host.parse::<Ipv6Addr>().is_ok();
        if !(is_name(&host) || ip && !wildcard) {
            return Err(bad(
                "a name is letters, digits, `-` and dots; `*` only as `*.`",
            ));
        }
        Ok(HostPattern {
            host,
            wildcard,
            port,
        })
    }

    fn is_loopback(&self) -> bool {
        !self.wildcard && LOOPBACK_NAMES.contains(&self.host.as_str())
    }

    fn port_ok(&self, port: u16) -> bool {
        self.port.map_or(port == 80 || port == 443, |p| p == port)
    }

    /// Whether a request to `host` (lower case) on `port` matches.
    fn allows(&self, host: &str, port: u16) -> bool {
        let host_ok = if self.wildcard {
            host.strip_suffix(self.host.as_str())
                .is_some_and(|sub| sub.len() > 1 && sub.ends_with('.'))
        } else {
            host == self.host || self.is_loopback() && LOOPBACK_NAMES.contains(&host)
        };
        host_ok && self.port_ok(port)
    }
}

impl std::fmt::Display for HostPattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.wildcard {
            write!(f, "*.")?;
        }
        if self.host.contains(':') {
            write!(f, "[{}]", self.host)?;
        } else {
            write!(f, "{}", self.host)?;
        }
        if let Some(p) = self.port {
            write!(f, ":{p}")?;
        }
        Ok(())
    }
}

/// Where refusals are reported.
type Report = Arc<Mutex<Option<Box<dyn Fn(String) + Send + Sync>>>>;

struct Shared {
    allow: Vec<HostPattern>,
    report: Report,
    stopped: AtomicBool,
    /// Connections being served: a run cannot make sup hold more than `MAX_OPEN` threads.
    open: AtomicUsize,
}

const MAX_OPEN: usize = 256;

/// The proxy of one jail, serving while it lives.
pub(super) struct Proxy {
    listener: Arc<TcpListener>,
    port: u16,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Proxy(127.0.0.1:{})", self.port)
    }
}

impl Proxy {
    /// Serve on `listener` (a listening socket inside the jail's namespace), one thread per
    /// connection.
    pub(super) fn start(listener: OwnedFd, allow: Vec<HostPattern>) -> std::io::Result<Proxy> {
        let listener = Arc::new(TcpListener::from(listener));
        let port = listener.local_addr()?.port();
        let shared = Arc::new(Shared {
            allow,
            report: Arc::default(),
            stopped: AtomicBool::new(false),
            open: AtomicUsize::new(0),
        });
        let (l, s) = (listener.clone(), shared.clone());
        std::thread::Builder::new()
            .name("sup-proxy".into())
            .spawn(move || accept_loop(&l, &s))?;
        Ok(Proxy {
            listener,
            port,
            shared,
        })
    }

    pub(super) fn port(&self) -> u16 {
        self.port
    }

    pub(super) fn hosts(&self) -> &[HostPattern] {
        &self.shared.allow
    }

    /// From now on each refusal is told to `f`.
    pub(super) fn on_refusal(&self, f: Box<dyn Fn(String) + Send + Sync>) {
        if let Ok(mut r) = self.shared.report.lock() {
            *r = Some(f);
        }
    }
}

impl Drop for Proxy {
    /// Shutting the listening socket down wakes the accepting thread, which then ends.
    fn drop(&mut self) {
        self.shared.stopped.store(true, Ordering::SeqCst);
        // SAFETY: shutdown on a socket this proxy still holds.
        unsafe { libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR) };
    }
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    loop {
        match listener.accept() {
            Ok((mut client, _)) => {
                if shared.open.fetch_add(1, Ordering::SeqCst) >= MAX_OPEN {
                    shared.open.fetch_sub(1, Ordering::SeqCst);
                    let _ = answer(
                        &mut client,
                        "503 Service Unavailable",
                        &format!("sup's proxy serves {MAX_OPEN} connections at once\n"),
                    );
                    continue;
                }
                let s = shared.clone();
                let spawned = std::thread::Builder::new()
                    .name("sup-proxy-conn".into())
                    .spawn(move || {
                        let _ = serve(client, &s);
                        s.open.fetch_sub(1, Ordering::SeqCst);
                    });
                if spawned.is_err() {
                    shared.open.fetch_sub(1, Ordering::SeqCst);
                }
            }
            Err(_) if shared.stopped.load(Ordering::SeqCst) => return,
            // Out of file descriptors, or an aborted connection: a moment, then on.
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// The head of a request (through the blank line) and what came after it.
fn read_head(client: &mut TcpStream) -> std::io::Result<(String, Vec<u8>)> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        let n = client.read(&mut chunk)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(end + 4);
            return Ok((String::from_utf8_lossy(&buf).into_owned(), rest));
        }
        if buf.len() > 64 * 1024 {
            return Err(std::io::Error::other("request head over 64 KiB"));
        }
    }
}

fn answer(client: &mut TcpStream, status: &str, body: &str) -> std::io::Result<()> {
    let reply = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
    client.write_all(reply.as_bytes())
}

/// One client connection: one request, then the tunnel.
fn serve(mut client: TcpStream, shared: &Shared) -> std::io::Result<()> {
    client.set_nodelay(true)?;
    client.set_read_timeout(Some(Duration::from_secs(30)))?;
    let (head, rest) = read_head(&mut client)?;
    client.set_read_timeout(None)?;
    let mut lines = head.split("\r\n");
    let first = lines.next().unwrap_or_default();
    let mut words = first.split(' ');
    let (method, target, version) = (
        words.next().unwrap_or_default(),
        words.next().unwrap_or_default(),
        words.next().unwrap_or("HTTP/1.1"),
    );
    let connect = method.eq_ignore_ascii_case("CONNECT");
    let (authority, path) = if connect {
        (target, "")
    } else if let Some(t) = target.strip_prefix("http://") {
        let end = t.find(['/', '?']).unwrap_or(t.len());
        (&t[..end], &t[end..])
    } else {
        return answer(
            &mut client,
            "400 Bad Request",
            "sup's proxy takes CONNECT host:port and absolute-form http:// requests\n",
        );
    };
    // Credentials in the URL (`user@host`) are not the host.
    let authority = authority.rsplit('@').next().unwrap_or_default();
    let Some((host, port)) = split_authority(authority) else {
        return answer(
            &mut client,
            "400 Bad Request",
            &format!("sup's proxy cannot read the host of `{target}`\n"),
        );
    };
    let port = port.unwrap_or(if connect { 443 } else { 80 });
    let shown = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    if !shared.allow.iter().any(|p| p.allows(&host, port)) {
        return refuse(
            &mut client,
            shared,
            &shown,
            "is not in the goal's `network` list",
        );
    }
    let loopback_ok = shared
        .allow
        .iter()
        .any(|p| p.is_loopback() && p.port_ok(port));
    // An address needs no resolver.
    let addrs: Vec<SocketAddr> = match host.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => (host.as_str(), port)
            .to_socket_addrs()
            .map(|a| a.collect())
            .unwrap_or_default(),
    };
    let reachable: Vec<SocketAddr> = addrs
        .iter()
        .copied()
        .filter(|a| loopback_ok || !is_local(a.ip()))
        .collect();
    if reachable.is_empty() && !addrs.is_empty() {
        return refuse(
            &mut client,
            shared,
            &shown,
            &format!(
                "resolves to this machine's loopback, which the goal's `network` list does not \
                 hold (it would need \"localhost:{port}\")"
            ),
        );
    }
    let upstream = reachable
        .iter()
        .find_map(|a| TcpStream::connect_timeout(a, Duration::from_secs(10)).ok());
    let Some(mut upstream) = upstream else {
        return answer(
            &mut client,
            "502 Bad Gateway",
            &format!("sup's proxy could not reach {shown}\n"),
        );
    };
    upstream.set_nodelay(true)?;
    if connect {
        client.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")?;
    } else {
        // One request per connection: the next one, to whatever host, comes through here again.
        let path = if path.is_empty() { "/" } else { path };
        let mut out = format!("{method} {path} {version}\r\n");
        for line in lines.filter(|l| !l.is_empty()) {
            let name = line.split(':').next().unwrap_or_default().trim();
            let dropped = [
                "proxy-connection",
                "proxy-authorization",
                "connection",
                "keep-alive",
            ];
            if !dropped.iter().any(|d| name.eq_ignore_ascii_case(d)) {
                out.push_str(line);
                out.push_str("\r\n");
            }
        }
        out.push_str("Connection: close\r\n\r\n");
        upstream.write_all(out.as_bytes())?;
    }
    upstream.write_all(&rest)?;
    tunnel(client, upstream)
}

/// The machine itself: loopback, or the unspecified address (which reaches it too).
fn is_local(ip: IpAddr) -> bool {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    ip.is_loopback() || ip.is_unspecified()
}

fn refuse(client: &mut TcpStream, shared: &Shared, shown: &str, why: &str) -> std::io::Result<()> {
    let listed: Vec<String> = shared.allow.iter().map(ToString::to_string).collect();
    if let Ok(r) = shared.report.lock()
        && let Some(f) = r.as_ref()
    {
        f(format!("network: refused {shown}: it {why}"));
    }
    answer(
        client,
        "403 Forbidden",
        &format!(
            "sup refused {shown}: it {why} (network = [{}]); add it there to allow it\n",
            listed
                .iter()
                .map(|l| format!("\"{l}\""))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    )
}

/// Bytes both ways until each side has finished sending.
fn tunnel(client: TcpStream, upstream: TcpStream) -> std::io::Result<()> {
    let (mut c2, mut u2) = (client.try_clone()?, upstream.try_clone()?);
    let up = std::thread::Builder::new()
        .name("sup-proxy-up".into())
        .spawn(move || {
            let _ = std::io::copy(&mut c2, &mut u2);
            let _ = u2.shutdown(Shutdown::Write);
        })?;
    let (mut c, mut u) = (client, upstream);
    let _ = std::io::copy(&mut u, &mut c);
    let _ = c.shutdown(Shutdown::Write);
    let _ = up.join();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_hosts_and_ports() {
        let p = |s: &str| HostPattern::parse(s).unwrap();
        assert!(p("registry.npmjs.org").allows("registry.npmjs.org", 443));
        assert!(p("registry.npmjs.org").allows("registry.npmjs.org", 80));
        assert!(!p("registry.npmjs.org").allows("registry.npmjs.org", 22));
        assert!(p("*.crates.io").allows("static.crates.io", 443));
        assert!(p("*.crates.io").allows("a.b.crates.io", 443));
        assert!(!p("*.crates.io").allows("crates.io", 443));
        assert!(!p("*.crates.io").allows("evilcrates.io", 443));
        assert!(p("localhost:8080").allows("127.0.0.1", 8080));
        assert!(p("127.0.0.1:8080").allows("localhost", 8080));
        assert!(!p("localhost:8080").allows("localhost", 5432));
        assert!(p("[::1]:8080").allows("::1", 8080));
        assert_eq!(p("Example.COM.:81").to_string(), "example.com:81");
        for bad in [
            "",
            "https://x.org",
            "x.org/path",
            "*",
            "a.*.org",
            "x.org:0",
            "x.org:http",
            "x.org:70000",
            "two words",
            "::1",
            "*.[::1]",
        ] {
            assert!(HostPattern::parse(bad).is_err(), "{bad}");
        }
    }
}
