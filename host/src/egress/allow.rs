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
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The hosts a route may call. Empty (the default) allows nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList {
    entries: Vec<HostPattern>,
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
            Ok(AllowList { entries: parsed })
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
        let ip: Option<IpAddr> = host.parse().ok();
        self.entries.iter().any(|p| {
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

    /// Whether a connection to `ip` is allowed: any address but the
    /// link-local and cloud-metadata ones ([`is_guarded`]), which only an
    /// entry naming that very address allows.
    pub fn allows_address(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        !is_guarded(ip)
            || self
                .entries
                .iter()
                .any(|p| matches!(p.host, HostMatch::Ip(named) if named == ip))
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

/// The AWS instance-metadata address over IPv6.
const AWS_METADATA_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254);
/// Alibaba Cloud's instance-metadata address (outside the link-local range).
const ALIBABA_METADATA: Ipv4Addr = Ipv4Addr::new(100, 100, 100, 200);

/// Link-local and cloud-metadata addresses: where a cloud VM's credentials
/// are served. A handler never reaches them through a wildcard or a name,
/// only through an entry that names the address itself.
///
/// - 169.254.0.0/16 (IPv4 link-local: AWS, GCP, Azure and others serve
///   metadata at 169.254.169.254);
/// - fe80::/10 (IPv6 link-local);
/// - fd00:ec2::254 (AWS metadata over IPv6);
/// - 100.100.100.200 (Alibaba Cloud metadata).
pub fn is_guarded(ip: IpAddr) -> bool {
    match canonical(ip) {
        IpAddr::V4(v4) => v4.is_link_local() || v4 == ALIBABA_METADATA,
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80 || v6 == AWS_METADATA_V6,
    }
}

/// IPv4-mapped IPv6 addresses (`::ffff:169.254.169.254`) as the IPv4
/// address they are, so neither check can be sidestepped by writing one.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
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
    fn metadata_and_link_local_addresses_need_an_entry_naming_them() {
        let wide = list(&["*://*:*"]);
        for guarded in [
            "169.254.169.254",
            "169.254.1.1",
            "fe80::1",
            "fd00:ec2::254",
            "::ffff:169.254.169.254",
            "100.100.100.200",
        ] {
            let ip: IpAddr = guarded.parse().unwrap();
            assert!(is_guarded(ip), "{guarded}");
            assert!(!wide.allows_address(ip), "{guarded} through a wildcard");
        }
        for open in ["127.0.0.1", "10.0.0.1", "::1", "fd00::1", "8.8.8.8"] {
            assert!(wide.allows_address(open.parse().unwrap()), "{open}");
        }
        let named = list(&["http://169.254.169.254"]);
        assert!(named.allows_address("169.254.169.254".parse().unwrap()));
        assert!(named.allows_address("::ffff:169.254.169.254".parse().unwrap()));
        assert!(!named.allows_address("169.254.169.253".parse().unwrap()));
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
