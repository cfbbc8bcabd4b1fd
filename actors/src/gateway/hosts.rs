//! Which `Host` a request may name: the defence against DNS rebinding. A web page at
//! `http://attacker.example` can rebind its own name to 127.0.0.1 and then read the
//! answers of a server listening there (its `Origin` is the page's own, so the origin guard
//! never sees a cross-origin request), but its requests still carry
//! `Host: attacker.example`. So a listener bound to a loopback address serves only
//! requests whose `Host` names a loopback host (`localhost`, `127.x.x.x`, `[::1]`, any
//! port), plus the names `--allowed-hosts` lists; a listener bound to any other address
//! checks nothing unless `--allowed-hosts` is given (then the same rule holds). A request
//! without `Host` (HTTP/1.0, or a client that is not a browser: browsers always send one)
//! is served.
//!
//! A refused request gets 403 in OpenAI's error shape, as a refused `Origin` does. Not
//! 421 (Misdirected Request): RFC 9110 lets a client retry a 421 on another connection,
//! which cannot help here, while 403 says the server understood and will not serve it.

use std::net::{Ipv4Addr, Ipv6Addr};

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::HOST;
use actix_web::middleware::Next;
use actix_web::web;

use super::errors::ApiError;
use super::origins::refuse_or_next;

/// The `Host` names a listener serves (vLLM has none; the flag is `--allowed-hosts`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllowedHosts {
    /// Whether anything is checked at all.
    checked: bool,
    /// `*` was listed: any host.
    any: bool,
    /// The listed names, normalized as [`host_name`] normalizes a header.
    names: Vec<String>,
}

impl AllowedHosts {
    /// The hosts a listener bound to a loopback address (`loopback`) or another one serves,
    /// with `list` (`--allowed-hosts`; `*` allows any) added to the loopback names.
    pub fn new(loopback: bool, list: &[String]) -> AllowedHosts {
        AllowedHosts {
            checked: loopback || !list.is_empty(),
            any: list.iter().any(|h| h == "*"),
            names: list
                .iter()
                .filter(|h| *h != "*")
                .filter_map(|h| host_name(h))
                .collect(),
        }
    }

    /// Whether a request whose `Host` header (or request-target authority) is `host`, as
    /// sent, is served.
    pub fn allows(&self, host: &str) -> bool {
        if !self.checked || self.any {
            return true;
        }
        match host_name(host) {
            Some(name) => is_loopback_name(&name) || self.names.contains(&name),
            None => false,
        }
    }
}

/// The host of a `Host` value without its port, lower-cased, one trailing dot dropped and
/// IPv6 brackets removed (a bare IPv6 address is taken as it is); `None` where it is
/// malformed (an empty host, a port that is not a number, text after the brackets).
fn host_name(host: &str) -> Option<String> {
    let host = host.trim();
    let name = if let Some(rest) = host.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        if !(after.is_empty() || after.strip_prefix(':').is_some_and(is_port)) {
            return None;
        }
        inside
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) if is_port(port) && !name.contains(':') => name,
            Some(_) if host.parse::<Ipv6Addr>().is_ok() => host,
            Some(_) => return None,
            None => host,
        }
    };
    let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
    (!name.is_empty()).then_some(name)
}

/// Whether `port` is a port number as a `Host` header writes it.
fn is_port(port: &str) -> bool {
    (1..=5).contains(&port.len()) && port.bytes().all(|b| b.is_ascii_digit())
}

/// Whether a normalized host name is `localhost` or a loopback address literal.
fn is_loopback_name(name: &str) -> bool {
    name == "localhost"
        || name.parse::<Ipv4Addr>().is_ok_and(|ip| ip.is_loopback())
        || name.parse::<Ipv6Addr>().is_ok_and(|ip| ip.is_loopback())
}

/// Middleware: 403 for a request whose `Host` header, or absolute request-target, names a
/// host the app's `web::Data<AllowedHosts>` does not allow (nothing is checked when the
/// app has none).
pub async fn refuse_foreign_hosts(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody + 'static>>, actix_web::Error> {
    let refused = req.app_data::<web::Data<AllowedHosts>>().and_then(|hosts| {
        let headers = req
            .headers()
            .get_all(HOST)
            .map(|h| h.to_str().unwrap_or(""));
        let target = req.uri().authority().map(|a| a.as_str());
        headers
            .chain(target)
            .find(|host| !hosts.allows(host))
            .map(str::to_owned)
    });
    let refusal = refused.map(|host| {
        ApiError::forbidden(format!(
            "the Host header {host:?} names a host this server does not serve (a server \
             bound to a loopback address serves only localhost, 127.x.x.x and [::1], \
             against DNS rebinding): start it with --allowed-hosts NAME to serve requests \
             addressed to another name"
        ))
        .with_param("Host")
    });
    refuse_or_next(req, next, refusal).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loopback(list: &[&str]) -> AllowedHosts {
        let list: Vec<String> = list.iter().map(|h| h.to_string()).collect();
        AllowedHosts::new(true, &list)
    }

    #[test]
    fn loopback_hosts_pass_with_or_without_ports_in_any_case() {
        let hosts = loopback(&[]);
        for host in [
            "localhost",
            "LOCALHOST:8000",
            "localhost.",
            "localhost.:8000",
            "127.0.0.1",
            "127.0.0.1:8000",
            "127.1.2.3:80",
            "[::1]",
            "[::1]:8000",
            "[0:0:0:0:0:0:0:1]:8000",
            "::1",
        ] {
            assert!(hosts.allows(host), "{host}");
        }
    }

    #[test]
    fn rebound_and_malformed_hosts_are_refused() {
        let hosts = loopback(&[]);
        for host in [
            "attacker.example",
            "attacker.example:8000",
            "localhost.attacker.com",
            "localhost.attacker.com:8000",
            "127.0.0.1.nip.io",
            "127.0.0.1.nip.io:8000",
            "10.0.0.1:8000",
            "0.0.0.0",
            "[::2]:8000",
            "[::1]x",
            "localhost:80a",
            "localhost:",
            "",
            ":8000",
        ] {
            assert!(!hosts.allows(host), "{host:?}");
        }
    }

    #[test]
    fn listed_hosts_widen_the_check_and_non_loopback_checks_only_when_listed() {
        let hosts = loopback(&["API.example.com.", "[fd00::1]"]);
        assert!(hosts.allows("api.example.com:443"));
        assert!(hosts.allows("Api.Example.Com"));
        assert!(hosts.allows("[fd00::1]:8000"));
        assert!(hosts.allows("localhost:1"));
        assert!(!hosts.allows("sub.api.example.com"));
        assert!(!hosts.allows("example.com"));
        assert!(loopback(&["*"]).allows("anything.example"));

        assert!(AllowedHosts::new(false, &[]).allows("anything.example"));
        let listed = AllowedHosts::new(false, &["api.example.com".into()]);
        assert!(listed.allows("api.example.com:8000"));
        assert!(listed.allows("127.0.0.1:8000"));
        assert!(!listed.allows("10.0.0.1:8000"));
    }
}
