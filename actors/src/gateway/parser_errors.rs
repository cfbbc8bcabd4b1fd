//! OpenAI-shaped bodies for the errors the HTTP/1 parser answers by itself. A malformed
//! request line (400), headers over the size limit (431) or headers that do not arrive in
//! time (408) never reach a handler: actix answers them with an empty body. Each
//! connection's socket is wrapped in [`ShapedErrors`], which gives such a bodiless error
//! response the JSON body every other error has. Handlers never send a 400, 408 or 431
//! without a body, so only the parser's own answers match.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use actix_web::http::StatusCode;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::errors::ApiError;

/// A connection whose bodiless parser errors go out with an OpenAI error body.
pub struct ShapedErrors<T> {
    inner: T,
    /// A rewritten response still to be written, and how much of it was.
    pending: Vec<u8>,
    written: usize,
}

impl<T> ShapedErrors<T> {
    /// Wraps a connection.
    pub fn new(inner: T) -> ShapedErrors<T> {
        ShapedErrors {
            inner,
            pending: Vec::new(),
            written: 0,
        }
    }

    /// The connection itself.
    pub fn get_ref(&self) -> &T {
        &self.inner
    }
}

impl<T: AsyncWrite + Unpin> ShapedErrors<T> {
    /// Writes what is left of a rewritten response.
    fn poll_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.pending.len() {
            let rest = &self.pending[self.written..];
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, rest))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        self.pending.clear();
        self.written = 0;
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for ShapedErrors<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for ShapedErrors<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_pending(cx))?;
        if let Some(shaped) = shape(buf) {
            this.pending = shaped;
            // What does not go out now goes out on the flush that follows.
            if let Poll::Ready(Err(err)) = this.poll_pending(cx) {
                return Poll::Ready(Err(err));
            }
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_pending(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_pending(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

/// The bytes to send instead of `buf` when it starts with a bodiless 400, 408 or 431
/// response; `None` for anything else.
fn shape(buf: &[u8]) -> Option<Vec<u8>> {
    let head_end = buf.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = std::str::from_utf8(&buf[..head_end]).ok()?;
    let mut status_line = head.split("\r\n").next()?.splitn(3, ' ');
    if !status_line.next()?.starts_with("HTTP/1.") {
        return None;
    }
    let status = StatusCode::from_u16(status_line.next()?.parse().ok()?).ok()?;
    let message = match status {
        StatusCode::BAD_REQUEST => {
            "the request is not valid HTTP/1.1: a malformed request line or header"
        }
        StatusCode::REQUEST_TIMEOUT => {
            "the request headers did not arrive in time (request_header_timeout)"
        }
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE => "the request headers are too large",
        _ => return None,
    };
    const EMPTY: &str = "\r\ncontent-length: 0\r\n";
    let at = head.to_ascii_lowercase().find(EMPTY)?;
    let body = serde_json::to_vec(&ApiError::new(status, message).body()).ok()?;
    let mut out = Vec::with_capacity(buf.len() + body.len() + 64);
    out.extend_from_slice(&buf[..at]);
    out.extend_from_slice(
        format!(
            "\r\ncontent-length: {}\r\ncontent-type: application/json\r\n",
            body.len()
        )
        .as_bytes(),
    );
    out.extend_from_slice(&buf[at + EMPTY.len()..head_end]);
    out.extend_from_slice(&body);
    out.extend_from_slice(&buf[head_end..]);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn only_bodiless_parser_errors_are_shaped() {
        let raw = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\nconnection: close\r\ndate: x\r\n\r\n";
        let shaped = String::from_utf8(shape(raw).unwrap()).unwrap();
        let (head, body) = shaped.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 431 "), "{head}");
        assert!(head.contains("\r\nconnection: close\r\ndate: x"), "{head}");
        assert!(head.contains(&format!("content-length: {}\r\n", body.len())));
        let json: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(json["error"]["code"], 431);
        assert_eq!(json["error"]["type"], "invalid_request_error");

        for kept in [
            &b"HTTP/1.1 400 Bad Request\r\ncontent-length: 12\r\n\r\n{\"error\":{}}"[..],
            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
            b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n",
            b"data: 400 \r\n\r\n",
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0",
        ] {
            assert_eq!(shape(kept), None, "{}", String::from_utf8_lossy(kept));
        }
    }

    /// A parser error written through the wrapper reaches the other end with its body,
    /// and other writes pass through untouched.
    #[tokio::test]
    async fn the_wrapper_rewrites_and_passes_through() {
        let (near, mut far) = tokio::io::duplex(16);
        let mut wrapped = ShapedErrors::new(near);
        let writer = tokio::spawn(async move {
            wrapped
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                .await?;
            let error = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n";
            wrapped.write_all(error).await?;
            wrapped.shutdown().await
        });
        let mut all = String::new();
        far.read_to_string(&mut all).await.unwrap();
        writer.await.unwrap().unwrap();
        let (ok, error) = all.split_at(all.find("HTTP/1.1 400").unwrap());
        assert_eq!(ok, "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok");
        let body = error.split_once("\r\n\r\n").unwrap().1;
        let json: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(json["error"]["code"], 400);
    }
}
