//! The publishing task: encodes each batch, sends it on the PUB socket with the next
//! sequence number, keeps the last `buffer_steps` for replay, and answers replay requests
//! on the ROUTER socket as vLLM's publisher does (a REQ client sends a start sequence as
//! 8 big-endian bytes; each kept batch from there comes back as `(sequence, payload)`, and
//! then `(-1, empty)`).

use super::sink::{now, EventBatch, KvEventSink};
use super::wire::WireFormat;
use crate::metrics;
use anyhow::Context;
use bytes::Bytes;
use peregrine_config::KvEventsConfig;
use std::collections::VecDeque;
use tokio::sync::mpsc;
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

/// The replay's end marker: -1 as 8 big-endian bytes.
const END_OF_REPLAY: [u8; 8] = (-1i64).to_be_bytes();

/// Binds (or connects) the sockets of `config` and starts the task that publishes what the
/// returned sink is given, in `format`. Its first batch is one `AllBlocksCleared`: the pool
/// starts empty, so a subscriber that knew this replica before a restart forgets its blocks.
/// Call from inside a tokio runtime; an error names the endpoint that could not be used.
pub async fn start_publisher(
    config: &KvEventsConfig,
    format: WireFormat,
) -> anyhow::Result<KvEventSink> {
    let mut publish = PubSocket::new();
    let endpoint = socket_address(&config.endpoint);
    if binds(&config.endpoint) {
        publish
            .bind(&endpoint)
            .await
            .with_context(|| format!("binding the KV events endpoint {}", config.endpoint))?;
    } else {
        publish
            .connect(&endpoint)
            .await
            .with_context(|| format!("connecting to the KV events endpoint {}", config.endpoint))?;
    }
    let replay = match &config.replay_endpoint {
        Some(endpoint) => {
            let mut socket = RouterSocket::new();
            socket
                .bind(&socket_address(endpoint))
                .await
                .with_context(|| format!("binding the KV events replay endpoint {endpoint}"))?;
            Some(socket)
        }
        None => None,
    };
    let (sink, batches) = KvEventSink::channel(config.max_queue_size);
    let mut publisher = Publisher {
        publish,
        topic: Bytes::from(config.topic.clone().into_bytes()),
        kept: VecDeque::new(),
        keep: config.buffer_steps,
        next_sequence: 0,
        format,
    };
    let cleared = publisher.format.encode_cleared(now());
    publisher.send(cleared, 1).await;
    tokio::spawn(publisher.run(batches, replay));
    Ok(sink)
}

/// vLLM's rule: bind a wildcard host or an `ipc://` path, connect to anything else.
fn binds(endpoint: &str) -> bool {
    endpoint.contains('*') || endpoint.contains("::") || endpoint.starts_with("ipc://")
}

/// The address as the `zeromq` crate takes it: libzmq's wildcard host `*` is 0.0.0.0.
fn socket_address(endpoint: &str) -> String {
    endpoint.replacen("tcp://*:", "tcp://0.0.0.0:", 1)
}

struct Publisher {
    publish: PubSocket,
    topic: Bytes,
    /// The last batches sent, with their sequence numbers, oldest first.
    kept: VecDeque<(u64, Bytes)>,
    /// How many batches `kept` holds at most.
    keep: usize,
    next_sequence: u64,
    format: WireFormat,
}

impl Publisher {
    async fn run(mut self, mut batches: mpsc::Receiver<EventBatch>, replay: Option<RouterSocket>) {
        let mut replay = replay;
        loop {
            tokio::select! {
                batch = batches.recv() => match batch {
                    Some(batch) => {
                        let payload = self.format.encode(&batch);
                        self.send(payload, batch.events.len()).await;
                    }
                    None => return,
                },
                request = recv_request(&mut replay) => match request {
                    Ok(request) => {
                        if let Some(socket) = &mut replay {
                            self.answer_replay(socket, request).await;
                        }
                    }
                    Err(err) => tracing::warn!("KV events replay: {err}"),
                },
            }
        }
    }

    /// Publishes one encoded batch under the next sequence number and keeps it for replay;
    /// a batch that could not be encoded is logged and its `events` counted as dropped
    /// (never sent empty).
    async fn send(&mut self, payload: Result<Vec<u8>, rmp_serde::encode::Error>, events: usize) {
        let payload = match payload {
            Ok(payload) => payload,
            Err(err) => {
                tracing::warn!("KV events: encoding a batch of {events} events: {err}");
                metrics::record_kv_events_dropped(events);
                return;
            }
        };
        let sequence = self.next_sequence;
        self.next_sequence += 1;
        let payload = Bytes::from(payload);
        let frames = vec![
            self.topic.clone(),
            Bytes::copy_from_slice(&sequence.to_be_bytes()),
            payload.clone(),
        ];
        if let Ok(message) = ZmqMessage::try_from(frames) {
            // A PUB socket drops what a slow subscriber cannot take; an error here is a
            // socket that is closing.
            if let Err(err) = self.publish.send(message).await {
                tracing::warn!("KV events: publishing batch {sequence}: {err}");
            }
        }
        metrics::record_kv_events_published();
        if self.keep > 0 {
            if self.kept.len() == self.keep {
                self.kept.pop_front();
            }
            self.kept.push_back((sequence, payload));
        }
    }

    /// Sends every kept batch from the requested sequence number on, then the end marker.
    async fn answer_replay(&self, socket: &mut RouterSocket, request: ZmqMessage) {
        let frames = request.into_vec();
        let [client, delimiter, start] = frames.as_slice() else {
            tracing::warn!("KV events replay: a request of {} frames", frames.len());
            return;
        };
        let Ok(start) = <[u8; 8]>::try_from(start.as_ref()).map(u64::from_be_bytes) else {
            tracing::warn!(
                "KV events replay: a start sequence of {} bytes",
                start.len()
            );
            return;
        };
        let reply = |sequence: Bytes, payload: Bytes| {
            ZmqMessage::try_from(vec![client.clone(), delimiter.clone(), sequence, payload])
        };
        let kept = self.kept.iter().filter(|(sequence, _)| *sequence >= start);
        for (sequence, payload) in kept {
            let sequence = Bytes::copy_from_slice(&sequence.to_be_bytes());
            if let Ok(message) = reply(sequence, payload.clone()) {
                if socket.send(message).await.is_err() {
                    return;
                }
            }
        }
        if let Ok(message) = reply(Bytes::from_static(&END_OF_REPLAY), Bytes::new()) {
            let _ = socket.send(message).await;
        }
    }
}

/// The next replay request, or never when there is no replay socket.
async fn recv_request(replay: &mut Option<RouterSocket>) -> zeromq::ZmqResult<ZmqMessage> {
    match replay {
        Some(socket) => socket.recv().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::{binds, socket_address};

    #[test]
    fn wildcards_and_ipc_bind_and_the_wildcard_host_is_every_address() {
        assert!(binds("tcp://*:5557"));
        assert!(binds("tcp://[::]:5557"));
        assert!(binds("ipc:///tmp/kv"));
        assert!(!binds("tcp://10.0.0.7:5557"));
        assert_eq!(socket_address("tcp://*:5557"), "tcp://0.0.0.0:5557");
        assert_eq!(socket_address("tcp://10.0.0.7:5557"), "tcp://10.0.0.7:5557");
    }
}
