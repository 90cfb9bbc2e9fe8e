//! `allowed_hosts`: which hosts a route's handler may call, in Spin's
//! syntax, and which addresses are refused even then.
//!
//! An entry is `scheme://host[:port]`:
//! - `scheme` is `http`, `https` or `*`;
//! - `host` is a name (`api.example.com`), a `*.` prefix wildcard
//!   (`*.example.com`: any name below it, not the name itself), an IP
//!   literal (`127.0.0.1`, `[::1]`), or `*` for any host;
//! - `port` is a number, a range (`8000-8010`) or `*`; without it, the
//!   scheme's default port (80, 443). With scheme `*` a port must be given.
//!
//! `*://*:*` allows everything. Names compare without case.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, OnceLock};

/// The hosts a route may call. Empty (the default) allows nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList {
    entries: Vec<HostPattern>,
    /// Hopper's own admin server, which a handler reaches only through an
    /// entry naming its address and port exactly.
    own: OwnEndpoint,
}

/// Where hopper's admin server listens, shared by every route's allow-list
/// and set once: at config load for a fixed port, when the server binds for
/// port 0. Until then nothing is guarded as the admin server.
#[derive(Clone, Default)]
pub struct OwnEndpoint(Arc<OnceLock<SocketAddr>>);

impl OwnEndpoint {
    /// Records the address; a second call keeps the first address.
    pub fn set(&self, addr: SocketAddr) {
        let _ = self.0.set(addr);
    }

    pub fn get(&self) -> Option<SocketAddr> {
        self.0.get().copied()
    }

    /// Whether a connection to `dest` could reach the admin server: the same
    /// port, and the listen address itself, any loopback address (the
    /// server may answer on each), `0.0.0.0`/`::` as a destination (which
    /// connects to this host), or any address at all when the server
    /// listens on every address (this host's own addresses cannot be told
    /// from others').
    fn reaches(&self, dest: SocketAddr) -> bool {
        let Some(own) = self.get() else {
            return false;
        };
        let (to, at) = (canonical(dest.ip()), canonical(own.ip()));
        dest.port() == own.port()
            && (to == at
                || to.is_unspecified()
                || at.is_unspecified()
                || (to.is_loopback() && at.is_loopback()))
    }
}

impl PartialEq for OwnEndpoint {
    fn eq(&self, other: &Self) -> bool {
        self.get() == other.get()
    }
}

impl Eq for OwnEndpoint {}

impl fmt::Debug for OwnEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.get() {
            Some(addr) => write!(f, "OwnEndpoint({addr})"),
            None => f.write_str("OwnEndpoint(unset)"),
        }
    }
}

/// Why an address is refused although the host matched an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guard {
    /// A link-local or cloud-metadata address ([`is_guarded`]).
    Metadata,
    /// Hopper's own admin server.
    Admin,
}

impl fmt::Display for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Guard::Metadata => "a link-local or metadata address",
            Guard::Admin => "hopper's own admin server",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct HostPattern {
    /// `None`: any scheme.
    scheme: Option<Scheme>,
    host: HostMatch,
    ports: Ports,
}

/// The two schemes a handler's request may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    Http,
    Https,
}

impl Scheme {
    pub fn default_port(self) -> u16 {
        match self {
            Scheme::Http => 80,
            Scheme::Https => 443,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum HostMatch {
    Any,
    /// `*.example.com`, kept as `.example.com`.
    Suffix(String),
    Name(String),
    Ip(IpAddr),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ports {
    Any,
    Range(u16, u16),
}

impl AllowList {
    /// Parses every entry; the error lists every bad one, each with what is
    /// wrong.
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<AllowList, Vec<String>> {
        let mut problems = Vec::new();
        let mut parsed = Vec::new();
        for entry in entries {
            let entry = entry.as_ref();
            match HostPattern::parse(entry) {
                Ok(pattern) => parsed.push(pattern),
                Err(problem) => problems.push(format!("allowed_hosts entry `{entry}`: {problem}")),
            }
        }
        if problems.is_empty() {
            Ok(AllowList {
                entries: parsed,
                own: OwnEndpoint::default(),
            })
        } else {
            Err(problems)
        }
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether a request to `scheme://host:port` is allowed. `host` is a
    /// name or an IP literal without brackets.
    pub fn allows(&self, scheme: Scheme, host: &str, port: u16) -> bool {
        self.entry_for(scheme, host, port).is_some()
    }

    /// The place of the first entry that allows a request to
    /// `scheme://host:port`, if one does: the entry whose
    /// `http.hosts` limits the request is held to.
    pub fn entry_for(&self, scheme: Scheme, host: &str, port: u16) -> Option<usize> {
        let ip: Option<IpAddr> = host.parse().ok();
        self.entries.iter().position(|p| {
            p.scheme.is_none_or(|s| s == scheme)
                && p.ports.contains(port)
                && match &p.host {
                    HostMatch::Any => true,
                    HostMatch::Ip(allowed) => ip.is_some_and(|ip| canonical(ip) == *allowed),
                    HostMatch::Name(name) => ip.is_none() && host.eq_ignore_ascii_case(name),
                    HostMatch::Suffix(suffix) => {
                        ip.is_none()
                            && host.len() > suffix.len()
                            && host.as_bytes()[host.len() - suffix.len()..]
                                .eq_ignore_ascii_case(suffix.as_bytes())
                    }
                }
        })
    }

    /// The place of the entry written as `entry` (the same scheme, host and
    /// ports, however spelled), if there is one; an error naming what is
    /// wrong when `entry` is not an entry at all.
    pub fn index_of(&self, entry: &str) -> Result<Option<usize>, String> {
        let pattern = HostPattern::parse(entry)?;
        Ok(self.entries.iter().position(|p| *p == pattern))
    }

    /// Guards the admin server at `own` (see [`OwnEndpoint`]).
    pub fn guard_own(&mut self, own: OwnEndpoint) {
        self.own = own;
    }

    /// Whether a connection to `ip` is allowed, port aside: any address but
    /// the link-local and cloud-metadata ones ([`is_guarded`]), which only
    /// an entry naming that very address allows.
    pub fn allows_address(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        !is_guarded(ip)
            || self
                .entries
                .iter()
                .any(|p| matches!(p.host, HostMatch::Ip(named) if named == ip))
    }

    /// Why a connection to `dest` is refused, if it is: a guarded address
    /// no entry names, or hopper's admin server, which only an entry naming
    /// its address and that one port allows (`http://127.0.0.1:9464`; not a
    /// wildcard, a name, or a port range).
    pub fn refuses(&self, dest: SocketAddr) -> Option<Guard> {
        if !self.allows_address(dest.ip()) {
            return Some(Guard::Metadata);
        }
        let ip = canonical(dest.ip());
        let named_exactly = || {
            self.entries.iter().any(|p| {
                matches!(p.host, HostMatch::Ip(named) if named == ip)
                    && p.ports == Ports::Range(dest.port(), dest.port())
            })
        };
        (self.own.reaches(dest) && !named_exactly()).then_some(Guard::Admin)
    }
}

impl fmt::Display for AllowList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.entries.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{}://", p.scheme.map_or("*", Scheme::as_str))?;
            match &p.host {
                HostMatch::Any => f.write_str("*")?,
                HostMatch::Suffix(s) => write!(f, "*{s}")?,
                HostMatch::Name(n) => f.write_str(n)?,
                HostMatch::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]")?,
                HostMatch::Ip(ip) => write!(f, "{ip}")?,
            }
            match p.ports {
                Ports::Any => f.write_str(":*")?,
                Ports::Range(a, b) if a == b => write!(f, ":{a}")?,
                Ports::Range(a, b) => write!(f, ":{a}-{b}")?,
            }
        }
        Ok(())
    }
}

impl HostPattern {
    fn parse(entry: &str) -> Result<HostPattern, String> {
        let Some((scheme, rest)) = entry.split_once("://") else {
            return Err(format!(
                "no scheme; write it as `https://{entry}` (or `http://`, `*://`)"
            ));
        };
        let scheme = match scheme.to_ascii_lowercase().as_str() {
            "http" => Some(Scheme::Http),
            "https" => Some(Scheme::Https),
            "*" => None,
            other => return Err(format!("scheme `{other}` is not http, https or *")),
        };
        if rest.contains(['/', '?', '#', '@']) {
            return Err("only scheme, host and port; no path, query or user".into());
        }
        let (host, port) = split_host_port(rest)?;
        let host = parse_host(host)?;
        let ports = match (port, scheme) {
            (None, Some(scheme)) => {
                let p = scheme.default_port();
                Ports::Range(p, p)
            }
            (None, None) => {
                return Err("scheme `*` needs a port: `*://host:*` or `*://host:8080`".into());
            }
            (Some(port), _) => parse_ports(port)?,
        };
        Ok(HostPattern {
            scheme,
            host,
            ports,
        })
    }
}

fn split_host_port(rest: &str) -> Result<(&str, Option<&str>), String> {
    if let Some(v6) = rest.strip_prefix('[') {
        let (ip, after) = v6
            .split_once(']')
            .ok_or("an IPv6 address needs its closing `]`")?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or("expected `:port` after `]`")?),
        };
        return Ok((ip, port));
    }
    Ok(match rest.rsplit_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (rest, None),
    })
}

fn parse_host(host: &str) -> Result<HostMatch, String> {
    if host.is_empty() {
        return Err("no host".into());
    }
    if host == "*" {
        return Ok(HostMatch::Any);
    }
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(HostMatch::Ip(canonical(ip)));
    }
    let (wildcard, name) = match host.strip_prefix("*.") {
        Some(name) => (true, name),
        None => (false, host),
    };
    if name.contains('*') {
        return Err("`*` is allowed only as the whole host or as a leading `*.`".into());
    }
    let valid = !name.is_empty()
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        });
    if !valid {
        return Err(format!("`{host}` is not a host name or an IP address"));
    }
    let name = name.to_ascii_lowercase();
    Ok(if wildcard {
        HostMatch::Suffix(format!(".{name}"))
    } else {
        HostMatch::Name(name)
    })
}

fn parse_ports(port: &str) -> Result<Ports, String> {
    if port == "*" {
        return Ok(Ports::Any);
    }
    let number = |p: &str| {
        p.parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("port `{p}` is not a number from 1 to 65535"))
    };
    match port.split_once('-') {
        Some((low, high)) => {
            let (low, high) = (number(low)?, number(high)?);
            if low > high {
                return Err(format!("port range {low}-{high} runs backwards"));
            }
            Ok(Ports::Range(low, high))
        }
        None => {
            let p = number(port)?;
            Ok(Ports::Range(p, p))
        }
    }
}

impl Ports {
    fn contains(self, port: u16) -> bool {
        match self {
            Ports::Any => true,
            Ports::Range(low, high) => (low..=high).contains(&port),
        }
    }
}

/// Where a cloud VM's or a pod's credentials are served, each range with
/// its source: link-local ranges and the metadata addresses outside them.
/// A handler never reaches them through a wildcard or a name, only through
/// an entry that names the address itself ([`is_guarded`]).
pub const GUARDED: [(IpAddr, u8, &str); 7] = [
    (
        IpAddr::V4(Ipv4Addr::new(169, 254, 0, 0)),
        16,
        "IPv4 link-local (RFC 3927): AWS, GCP, Azure, Oracle, DigitalOcean and OpenStack serve metadata at 169.254.169.254",
    ),
    (
        IpAddr::V4(Ipv4Addr::new(100, 100, 100, 200)),
        32,
        "Alibaba Cloud instance metadata",
    ),
    (
        IpAddr::V4(Ipv4Addr::new(192, 0, 0, 192)),
        32,
        "Oracle Cloud instance metadata (the older address beside 169.254.169.254)",
    ),
    (
        IpAddr::V6(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0)),
        10,
        "IPv6 link-local (RFC 4291)",
    ),
    (
        IpAddr::V6(Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0)),
        32,
        "AWS over IPv6: instance metadata at fd00:ec2::254, the EKS Pod Identity agent at fd00:ec2::23",
    ),
    (
        IpAddr::V6(Ipv6Addr::new(0xfd20, 0x00ce, 0, 0, 0, 0, 0, 0x0254)),
        128,
        "GCP instance metadata over IPv6",
    ),
    (
        IpAddr::V6(Ipv6Addr::new(0xfd00, 0x0042, 0, 0, 0, 0, 0, 0x0042)),
        128,
        "Scaleway instance metadata over IPv6",
    ),
];

/// Whether `ip` is in one of the [`GUARDED`] ranges, each IPv4 one also in
/// its IPv4-mapped (`::ffff:a.b.c.d`), IPv4-compatible (`::a.b.c.d`) and
/// NAT64 (`64:ff9b::a.b.c.d`) forms.
pub fn is_guarded(ip: IpAddr) -> bool {
    let ip = canonical(ip);
    GUARDED
        .iter()
        .any(|&(net, bits, _)| in_prefix(ip, net, bits))
}

/// Whether `ip` lies in `net`/`bits` (false across address families).
fn in_prefix(ip: IpAddr, net: IpAddr, bits: u8) -> bool {
    match (ip, net) {
        (IpAddr::V4(ip), IpAddr::V4(net)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(bits)).unwrap_or(0);
            u32::from(ip) & mask == u32::from(net) & mask
        }
        (IpAddr::V6(ip), IpAddr::V6(net)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(bits)).unwrap_or(0);
            u128::from(ip) & mask == u128::from(net) & mask
        }
        _ => false,
    }
}

/// The IPv6 forms that carry an IPv4 address, as that IPv4 address, so no
/// check can be sidestepped by writing one:
/// - IPv4-mapped, `::ffff:169.254.169.254`;
/// - IPv4-compatible (deprecated, still routed by some stacks),
///   `::169.254.169.254`; `::` and `::1` stay IPv6;
/// - the NAT64 well-known prefix 64:ff9b::/96, `64:ff9b::169.254.169.254`,
///   which a NAT64 gateway translates to that IPv4 address.
fn canonical(ip: IpAddr) -> IpAddr {
    let IpAddr::V6(v6) = ip else {
        return ip;
    };
    if let Some(v4) = v6.to_ipv4_mapped() {
        return IpAddr::V4(v4);
    }
    let s = v6.segments();
    let low = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    if s[..6] == [0; 6] && !(v6.is_unspecified() || v6.is_loopback()) {
        return IpAddr::V4(low);
    }
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return IpAddr::V4(low);
    }
    IpAddr::V6(v6)
}

#[cfg(test)]
mod tests {
    use super::*;
    use Scheme::{Http, Https};

    fn list(entries: &[&str]) -> AllowList {
        AllowList::parse(entries).unwrap()
    }

    #[test]
    fn an_entry_without_a_port_means_the_schemes_default_port() {
        let l = list(&["https://api.example.com"]);
        assert!(l.allows(Https, "api.example.com", 443));
        assert!(l.allows(Https, "API.Example.COM", 443));
        assert!(!l.allows(Https, "api.example.com", 8443));
        assert!(!l.allows(Http, "api.example.com", 80));
        assert!(!l.allows(Https, "other.example.com", 443));
    }

    #[test]
    fn wildcards_ports_and_ranges() {
        let l = list(&["https://*.example.com", "http://127.0.0.1:8000-8010"]);
        assert!(l.allows(Https, "a.example.com", 443));
        assert!(l.allows(Https, "a.b.example.com", 443));
        assert!(!l.allows(Https, "example.com", 443), "the suffix only");
        assert!(!l.allows(Https, "badexample.com", 443));
        assert!(l.allows(Http, "127.0.0.1", 8005));
        assert!(!l.allows(Http, "127.0.0.1", 8011));
        assert!(
            !l.allows(Http, "localhost", 8005),
            "an IP entry is not a name"
        );

        let any = list(&["*://*:*"]);
        assert!(any.allows(Http, "anything", 1));
        assert!(any.allows(Https, "10.0.0.1", 65535));
        let v6 = list(&["http://[::1]:8080"]);
        assert!(v6.allows(Http, "::1", 8080));
        assert!(!AllowList::default().allows(Http, "127.0.0.1", 80));
    }

    #[test]
    fn every_bad_entry_is_reported_with_its_problem() {
        let problems = AllowList::parse(&[
            "example.com",
            "ftp://example.com",
            "https://example.com/path",
            "*://example.com",
            "https://ex*ample.com",
            "http://127.0.0.1:0",
            "http://127.0.0.1:90-80",
            "https://",
            "http://[::1",
            "https://example.com:http",
        ])
        .unwrap_err();
        let text = problems.join("\n");
        for expected in [
            "`example.com`: no scheme; write it as `https://example.com`",
            "`ftp://example.com`: scheme `ftp` is not http, https or *",
            "`https://example.com/path`: only scheme, host and port",
            "`*://example.com`: scheme `*` needs a port",
            "`https://ex*ample.com`: `*` is allowed only as the whole host",
            "`http://127.0.0.1:0`: port `0` is not a number from 1 to 65535",
            "`http://127.0.0.1:90-80`: port range 90-80 runs backwards",
            "`https://`: no host",
            "`http://[::1`: an IPv6 address needs its closing `]`",
            "`https://example.com:http`: port `http` is not a number",
        ] {
            assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
        }
        assert_eq!(problems.len(), 10, "{text}");
    }

    #[test]
    fn the_guarded_table_in_the_docs_is_this_one() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/operations.md");
        let docs = std::fs::read_to_string(path).unwrap();
        let table = docs
            .split("<!-- guarded addresses: start -->")
            .nth(1)
            .and_then(|rest| rest.split("<!-- guarded addresses: end -->").next())
            .expect("docs/operations.md has the guarded-addresses table");
        let rows: Vec<&str> = table
            .lines()
            .filter(|l| l.starts_with("| ") && !l.starts_with("| range"))
            .collect();
        let expected: Vec<String> = GUARDED
            .iter()
            .map(|(net, bits, source)| format!("| {net}/{bits} | {source} |"))
            .collect();
        assert_eq!(rows, expected, "docs/operations.md, guarded addresses");
    }

    #[test]
    fn every_guarded_range_is_guarded_at_both_ends_and_not_beside_them() {
        for (net, bits, source) in GUARDED {
            let (first, last, before, after) = match net {
                IpAddr::V4(v4) => {
                    let n = u32::from(v4);
                    let size = 1u64 << (32 - bits);
                    let last = (u64::from(n) + size - 1) as u32;
                    (
                        IpAddr::V4(n.into()),
                        IpAddr::V4(last.into()),
                        IpAddr::V4((n - 1).into()),
                        IpAddr::V4((last + 1).into()),
                    )
                }
                IpAddr::V6(v6) => {
                    let n = u128::from(v6);
                    let last = n | (u128::MAX.checked_shr(u32::from(bits)).unwrap_or(0));
                    (
                        IpAddr::V6(n.into()),
                        IpAddr::V6(last.into()),
                        IpAddr::V6((n - 1).into()),
                        IpAddr::V6((last + 1).into()),
                    )
                }
            };
            assert!(is_guarded(first), "{first}: {source}");
            assert!(is_guarded(last), "{last}: {source}");
            assert!(!is_guarded(before), "{before}, before {source}");
            assert!(!is_guarded(after), "{after}, after {source}");
        }
    }

    #[test]
    fn metadata_and_link_local_addresses_need_an_entry_naming_them() {
        let wide = list(&["*://*:*"]);
        for guarded in [
            "169.254.169.254",
            "169.254.1.1",
            "fe80::1",
            "fd00:ec2::254",
            "::ffff:169.254.169.254",
            "100.100.100.200",
            // Regression: only fd00:ec2::254 was guarded; the EKS Pod
            // Identity agent is at fd00:ec2::23.
            "fd00:ec2::23",
            "fd00:ec2:ffff::1",
            // Regression: the IPv4-compatible and NAT64 forms passed.
            "::169.254.169.254",
            "::a9fe:a9fe",
            "64:ff9b::169.254.169.254",
            "64:ff9b::a9fe:a9fe",
            "::100.100.100.200",
            "64:ff9b::100.100.100.200",
            // Regression: the GCP, Scaleway and Oracle addresses passed.
            "fd20:ce::254",
            "fd00:42::42",
            "192.0.0.192",
            "::ffff:192.0.0.192",
            "64:ff9b::192.0.0.192",
        ] {
            let ip: IpAddr = guarded.parse().unwrap();
            assert!(is_guarded(ip), "{guarded}");
            assert!(!wide.allows_address(ip), "{guarded} through a wildcard");
        }
        for open in [
            "127.0.0.1",
            "10.0.0.1",
            "::1",
            "::",
            "fd00::1",
            "fd00:ec3::23",
            "64:ff9b::8.8.8.8",
            "64:ff9b:1::169.254.169.254",
            "8.8.8.8",
            "fd20:ce::255",
            "fd00:42::43",
            "192.0.0.193",
            "169.255.0.1",
        ] {
            assert!(wide.allows_address(open.parse().unwrap()), "{open}");
        }
        let named = list(&["http://169.254.169.254"]);
        assert!(named.allows_address("169.254.169.254".parse().unwrap()));
        assert!(named.allows_address("::ffff:169.254.169.254".parse().unwrap()));
        assert!(!named.allows_address("169.254.169.253".parse().unwrap()));
        assert!(named.allows_address("64:ff9b::169.254.169.254".parse().unwrap()));
        assert!(named.allows_address("::169.254.169.254".parse().unwrap()));
    }

    fn at(addr: &str) -> SocketAddr {
        addr.parse().unwrap()
    }

    #[test]
    fn the_admin_server_needs_an_entry_naming_its_address_and_port() {
        let own = OwnEndpoint::default();
        let mut wide = list(&[
            "*://*:*",
            "http://127.0.0.1:9000-9999",
            "http://localhost:9464",
        ]);
        wide.guard_own(own.clone());
        assert_eq!(wide.refuses(at("127.0.0.1:9464")), None, "not bound yet");
        own.set(at("127.0.0.1:9464"));
        for reaching in [
            "127.0.0.1:9464",
            "127.0.0.2:9464",
            "[::1]:9464",
            "[::ffff:127.0.0.1]:9464",
            "[::127.0.0.1]:9464",
            "0.0.0.0:9464",
            "[::]:9464",
        ] {
            assert_eq!(wide.refuses(at(reaching)), Some(Guard::Admin), "{reaching}");
        }
        for open in ["127.0.0.1:9465", "10.0.0.1:9464", "[fd00::1]:9464"] {
            assert_eq!(wide.refuses(at(open)), None, "{open}");
        }
        assert_eq!(
            wide.refuses(at("169.254.169.254:80")),
            Some(Guard::Metadata)
        );

        let mut exact = list(&["http://127.0.0.1:9464"]);
        exact.guard_own(own.clone());
        assert_eq!(exact.refuses(at("127.0.0.1:9464")), None);
        assert_eq!(
            exact.refuses(at("[::1]:9464")),
            Some(Guard::Admin),
            "the entry names 127.0.0.1, not ::1"
        );

        let everywhere = OwnEndpoint::default();
        everywhere.set(at("0.0.0.0:9464"));
        let mut any = list(&["*://*:*"]);
        any.guard_own(everywhere);
        assert_eq!(any.refuses(at("10.1.2.3:9464")), Some(Guard::Admin));
        assert_eq!(any.refuses(at("10.1.2.3:9465")), None);
    }

    #[test]
    fn displays_as_written_in_canonical_form() {
        let l = list(&["HTTPS://*.Example.com", "http://[::1]:80-90", "*://*:*"]);
        assert_eq!(
            l.to_string(),
            "https://*.example.com:443, http://[::1]:80-90, *://*:*"
        );
    }
}
