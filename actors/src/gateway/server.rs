//! The HTTP listener: the app (the routes behind the host and origin guards and CORS)
//! served over HTTP/1.1 with bounded connections. A client has `request_header_timeout` to
//! send its headers (and an idle connection stays open as long), and
//! `request_body_timeout` to send its body; no more connections are held at once than the
//! process's open-file limit leaves, so slow or stalled clients cannot exhaust it (further
//! ones wait in the accept backlog). Each connection goes through [`on_connect`] and
//! [`ShapedErrors`].

use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::time::Duration;

use actix_http::{HttpService, KeepAlive};
use actix_server::Server;
use actix_service::{fn_service, map_config, IntoServiceFactory, ServiceFactoryExt};
use actix_web::body::MessageBody;
use actix_web::dev::{AppConfig, ServiceFactory, ServiceRequest, ServiceResponse};
use actix_web::middleware::from_fn;
use actix_web::rt::net::TcpStream;
use actix_web::{web, App};
use anyhow::Context;

use super::hosts::{refuse_foreign_hosts, AllowedHosts};
use super::origins::{refuse_foreign_origins, AllowedOrigins};
use super::parser_errors::ShapedErrors;
use super::peer::on_connect;
use super::routes::routes;
use super::state::GatewayState;

/// Open files kept for the server's own use (the model's files, the log, pipes) when the
/// connection limit is derived from the open-file limit.
pub const RESERVED_FILES: u64 = 256;

/// Open files one client connection holds: its socket, and the duplicate its
/// `PeerProbe` watches for a client that leaves (`peer.rs`).
pub const FILES_PER_CONNECTION: u64 = 2;

/// How the listener is set up.
#[derive(Clone, Debug)]
pub struct HttpSettings {
    /// The address to listen on.
    pub host: String,
    /// The port; 0 picks a free one.
    pub port: u16,
    /// HTTP worker threads.
    pub workers: usize,
    /// How long a client has to send its headers; also the keep-alive.
    pub header_timeout: Duration,
    /// The most connections open at once; `None`: what the open-file limit leaves.
    pub max_connections: Option<usize>,
    /// Browser origins allowed to call the API.
    pub allowed_origins: Vec<String>,
    /// `Host` names served besides the loopback ones (see [`AllowedHosts`]).
    pub allowed_hosts: Vec<String>,
}

/// The gateway's app over `state`: the routes behind CORS for `origins` and the guard that
/// refuses every other origin, all behind the guard that refuses `Host`s not in `hosts`.
pub fn app(
    state: web::Data<GatewayState>,
    origins: web::Data<AllowedOrigins>,
    hosts: web::Data<AllowedHosts>,
) -> App<
    impl ServiceFactory<
        ServiceRequest,
        Config = (),
        Response = ServiceResponse<impl MessageBody>,
        Error = actix_web::Error,
        InitError = (),
    >,
> {
    let cors = origins.cors();
    App::new()
        .app_data(state)
        .app_data(origins)
        .app_data(hosts)
        .wrap(cors)
        .wrap(from_fn(refuse_foreign_origins))
        .wrap(from_fn(refuse_foreign_hosts))
        .configure(routes)
}

/// A bound, not yet running, server.
pub struct Bound {
    /// The server; await it to run it.
    pub server: Server,
    /// The addresses it listens on.
    pub addrs: Vec<SocketAddr>,
    /// The connection limit it holds to.
    pub max_connections: usize,
}

/// Binds the listener for `state` as `settings` say.
pub fn bind(state: web::Data<GatewayState>, settings: &HttpSettings) -> anyhow::Result<Bound> {
    let max_connections = connection_limit(settings.max_connections)?;
    let workers = settings.workers.max(1);
    let origins = web::Data::new(AllowedOrigins::new(&settings.allowed_origins));
    let targets = (settings.host.as_str(), settings.port)
        .to_socket_addrs()
        .with_context(|| format!("resolving {}:{}", settings.host, settings.port))?;
    let mut builder = Server::build()
        .workers(workers)
        .max_concurrent_connections(max_connections.div_ceil(workers))
        .disable_signals();
    let mut addrs = Vec::new();
    for target in targets {
        let listener = TcpListener::bind(target).with_context(|| format!("binding {target}"))?;
        let addr = listener.local_addr()?;
        addrs.push(addr);
        let hosts = web::Data::new(AllowedHosts::new(
            addr.ip().is_loopback(),
            &settings.allowed_hosts,
        ));
        let (state, origins, timeout) = (state.clone(), origins.clone(), settings.header_timeout);
        builder = builder.listen(format!("peregrine-{addr}"), listener, move || {
            let app = app(state.clone(), origins.clone(), hosts.clone())
                .into_factory()
                .map_err(|err: actix_web::Error| err.error_response());
            let http = HttpService::build()
                .keep_alive(KeepAlive::Timeout(timeout))
                .client_request_timeout(timeout)
                .client_disconnect_timeout(Duration::from_secs(1))
                .local_addr(addr)
                .on_connect_ext(|io: &ShapedErrors<TcpStream>, data: &mut _| {
                    on_connect(io.get_ref(), data)
                })
                .h1(map_config(app, move |()| {
                    // The app's URL host (actix's own test server builds it this way).
                    AppConfig::__priv_test_new(false, addr.to_string(), addr)
                }));
            fn_service(|io: TcpStream| async move {
                let peer = io.peer_addr().ok();
                Ok((ShapedErrors::new(io), peer))
            })
            .and_then(http)
        })?;
    }
    anyhow::ensure!(
        !addrs.is_empty(),
        "{} resolves to no address",
        settings.host
    );
    Ok(Bound {
        server: builder.run(),
        addrs,
        max_connections,
    })
}

/// The connection limit: `asked`, or as many connections as the open-file limit (raised to
/// its hard limit first, as vLLM does) holds after [`RESERVED_FILES`], at
/// [`FILES_PER_CONNECTION`] each; refused when `asked` is more.
fn connection_limit(asked: Option<usize>) -> anyhow::Result<usize> {
    let Some(files) = raise_open_file_limit() else {
        return Ok(asked.unwrap_or(25_000));
    };
    let left = (files.saturating_sub(RESERVED_FILES) / FILES_PER_CONNECTION).max(1);
    let left = usize::try_from(left).unwrap_or(usize::MAX);
    match asked {
        None => Ok(left),
        Some(asked) if asked <= left => Ok(asked),
        Some(asked) => anyhow::bail!(
            "max_connections {asked} exceeds what the open-file limit ({files}) holds after \
             {RESERVED_FILES} files for the server itself, at {FILES_PER_CONNECTION} files a \
             connection ({left}): raise `ulimit -n` or lower max_connections"
        ),
    }
}

/// Raises the soft open-file limit to the hard one and returns it; `None` where it cannot
/// be read.
fn raise_open_file_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write only the struct passed to them.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return None;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit = raised;
            }
        }
    }
    Some(limit.rlim_cur)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_connection_limit_stays_below_the_open_file_limit() {
        let files = raise_open_file_limit().expect("Linux has an open-file limit");
        let left = ((files - RESERVED_FILES) / FILES_PER_CONNECTION) as usize;
        assert_eq!(connection_limit(None).unwrap(), left);
        assert_eq!(connection_limit(Some(16)).unwrap(), 16);
        let err = connection_limit(Some(left + 1)).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!("max_connections {}", left + 1)),
            "{err}"
        );
    }
}
