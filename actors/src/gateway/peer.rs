//! Setting up each client connection: Nagle's algorithm off, so that streamed tokens go out
//! as they are written, and a way to notice a client that went away while its whole
//! (non-streamed) response is being generated. A stream notices on its next write; a whole
//! response writes nothing until the end, and actix keeps running a handler after the
//! client closes its side. So each connection keeps a duplicate of its socket, and the
//! handler peeks at it: end of file means the client closed, and the request is cancelled
//! at once.

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

/// For `HttpServer::on_connect`: turns Nagle's algorithm off on the connection and stores
/// a [`PeerProbe`] in its data. A streamed token is a small write; under Nagle it waits
/// until the client acknowledges the write before it, which a client delays by up to 40 ms
/// (Linux): the first token waited on the acknowledgement of the response's headers, and
/// the rest came in bursts.
pub fn on_connect(connection: &dyn Any, data: &mut Extensions) {
    let Some(tcp) = connection.downcast_ref::<TcpStream>() else {
        return;
    };
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::warn!("TCP_NODELAY on a client connection: {e}");
    }
    if let Ok(fd) = tcp.as_fd().try_clone_to_owned() {
        data.insert(PeerProbe(Arc::new(std::net::TcpStream::from(fd))));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    /// A connection comes out of `on_connect` with Nagle's algorithm off and a probe that
    /// sees the client close.
    #[tokio::test]
    async fn a_connection_gets_nodelay_and_a_probe() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        assert!(!server.nodelay().unwrap(), "Nagle is on by default");
        let mut data = Extensions::new();
        on_connect(&server, &mut data);
        assert!(server.nodelay().unwrap());
        let probe = data.get::<PeerProbe>().expect("a probe").clone();
        assert!(!probe.closed());
        drop(client);
        tokio::time::timeout(Duration::from_secs(5), probe.closed_wait())
            .await
            .expect("the probe sees the close");
    }
}
