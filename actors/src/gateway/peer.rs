//! Noticing a client that went away while its whole (non-streamed) response is being
//! generated. A stream notices on its next write; a whole response writes nothing until
//! the end, and actix keeps running a handler after the client closes its side. So each
//! connection keeps a duplicate of its socket, and the handler peeks at it: end of file
//! means the client closed, and the request is cancelled at once.

use actix_web::dev::Extensions;
use actix_web::rt::net::TcpStream;
use std::any::Any;
use std::io::ErrorKind;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;

/// How often a waiting handler checks its client.
const POLL: Duration = Duration::from_millis(50);

/// A duplicate handle of one connection's socket (non-blocking, as the original).
#[derive(Clone)]
pub struct PeerProbe(Arc<std::net::TcpStream>);

impl PeerProbe {
    /// Whether the client has closed the connection (or it was reset).
    pub fn closed(&self) -> bool {
        match self.0.peek(&mut [0u8; 1]) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => e.kind() != ErrorKind::WouldBlock && e.kind() != ErrorKind::Interrupted,
        }
    }

    /// Resolves once the client has gone.
    pub async fn closed_wait(&self) {
        while !self.closed() {
            tokio::time::sleep(POLL).await;
        }
    }
}

/// For `HttpServer::on_connect`: stores a [`PeerProbe`] in the connection's data.
pub fn on_connect(connection: &dyn Any, data: &mut Extensions) {
    let Some(tcp) = connection.downcast_ref::<TcpStream>() else {
        return;
    };
    if let Ok(fd) = tcp.as_fd().try_clone_to_owned() {
        data.insert(PeerProbe(Arc::new(std::net::TcpStream::from(fd))));
    }
}
