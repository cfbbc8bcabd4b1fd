//! The KV allocator's end of the event queue.

use crate::kv_allocator::CacheEvent;
use crate::metrics;
use std::time::{SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;

/// One step's cache changes, stamped with the wall-clock time they were taken.
#[derive(Clone, Debug, PartialEq)]
pub struct EventBatch {
    /// Seconds since the Unix epoch.
    pub ts: f64,
    /// The changes, oldest first.
    pub events: Vec<CacheEvent>,
}

/// Where the KV allocator puts each step's changes; cheap to clone. Never waits: when the
/// publisher is `max_queue_size` batches behind, a batch is dropped and its events counted
/// in `peregrine:kv_events_dropped_total`.
#[derive(Clone, Debug)]
pub struct KvEventSink {
    queue: mpsc::Sender<EventBatch>,
}

impl KvEventSink {
    /// A sink and the receiving end of its queue of `max_queue_size` batches (at least 1).
    pub fn channel(max_queue_size: usize) -> (KvEventSink, mpsc::Receiver<EventBatch>) {
        let (queue, batches) = mpsc::channel(max_queue_size.max(1));
        (KvEventSink { queue }, batches)
    }

    /// Queues `events` as one batch stamped now; nothing when there are none.
    pub fn send(&self, events: Vec<CacheEvent>) {
        if events.is_empty() {
            return;
        }
        if let Err(refused) = self.queue.try_send(EventBatch { ts: now(), events }) {
            metrics::record_kv_events_dropped(refused.into_inner().events.len());
        }
    }
}

/// Seconds since the Unix epoch, as a batch's `ts`.
pub(super) fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::KvEventSink;
    use crate::kv_allocator::{CacheEvent, ChainId, Medium};
    use metrics_exporter_prometheus::PrometheusBuilder;

    fn removed() -> Vec<CacheEvent> {
        vec![CacheEvent::Removed {
            chain: ChainId::ROOT,
            medium: Medium::Pool,
        }]
    }

    #[test]
    fn a_full_queue_drops_the_batch_instead_of_waiting_and_counts_its_events() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            let (sink, mut batches) = KvEventSink::channel(2);
            sink.send(Vec::new());
            for _ in 0..3 {
                sink.send(removed());
            }
            assert_eq!(batches.try_recv().unwrap().events, removed());
            assert_eq!(batches.try_recv().unwrap().events, removed());
            assert!(batches.try_recv().is_err(), "the third batch was dropped");
            drop(batches);
            sink.send(removed());
        });
        let text = handle.render();
        assert!(
            text.contains("peregrine:kv_events_dropped_total 2"),
            "{text}"
        );
    }
}
