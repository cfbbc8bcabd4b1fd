//! `--kv-events-config`: vLLM's options for publishing KV-cache events (a JSON object on the
//! command line, a `[kv_events_config]` table in the file), with the same fields and
//! defaults as vLLM's `KVEventsConfig`, and one of Peregrine's: the wire encoding.

use serde::Deserialize;

/// The per-subscriber send queue of Peregrine's ZeroMQ publisher, in messages: fixed by the
/// `zeromq` crate, and vLLM's default high-water mark.
pub const KV_EVENTS_HWM: u64 = 100_000;

/// How KV-cache events are published.
#[derive(Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct KvEventsConfig {
    /// Whether events are recorded and published at all.
    #[serde(default)]
    pub enable_kv_cache_events: bool,
    /// `zmq` or `null`; unset: `zmq` when events are enabled (as vLLM).
    #[serde(default)]
    pub publisher: Option<KvEventsPublisher>,
    /// The ZeroMQ PUB endpoint: bound when it has a wildcard host (`tcp://*:5557`) or is
    /// `ipc://`, else connected to.
    #[serde(default = "default_endpoint")]
    pub endpoint: String,
    /// The ROUTER endpoint that answers replay requests; `None`: no replay.
    #[serde(default)]
    pub replay_endpoint: Option<String>,
    /// How many of the last batches are kept for replay.
    #[serde(default = "default_buffer_steps")]
    pub buffer_steps: usize,
    /// The PUB socket's high-water mark; only [`KV_EVENTS_HWM`] is honoured.
    #[serde(default = "default_hwm")]
    pub hwm: u64,
    /// Batches that may wait for the publisher before new ones are dropped (and counted).
    #[serde(default = "default_max_queue_size")]
    pub max_queue_size: usize,
    /// The topic frame of every message.
    #[serde(default)]
    pub topic: String,
    /// How each event is encoded (Peregrine's field; vLLM changed its encoding in 0.24).
    #[serde(default)]
    pub encoding: KvEventsEncoding,
}

/// Where events go.
#[derive(Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum KvEventsPublisher {
    /// Nowhere.
    Null,
    /// A ZeroMQ PUB socket.
    Zmq,
}

/// The msgpack form of an event inside a batch (the batch is `[ts, events, rank]` in both).
#[derive(Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum KvEventsEncoding {
    /// A map of named fields with the tag under `type` (vLLM 0.24 and later).
    #[default]
    Map,
    /// A positional array whose first element is the tag (vLLM before 0.24).
    Array,
}

fn default_endpoint() -> String {
    "tcp://*:5557".to_string()
}

fn default_buffer_steps() -> usize {
    10_000
}

fn default_hwm() -> u64 {
    KV_EVENTS_HWM
}

fn default_max_queue_size() -> usize {
    100_000
}

impl KvEventsConfig {
    /// Parses the JSON object `--kv-events-config` takes.
    pub fn from_json(text: &str) -> Result<KvEventsConfig, String> {
        serde_json::from_str(text).map_err(|e| format!("not a KV events configuration: {e}"))
    }

    /// Whether events are published: enabled, with a publisher other than `null`.
    pub fn publishes(&self) -> bool {
        self.enable_kv_cache_events && self.publisher != Some(KvEventsPublisher::Null)
    }

    /// Checks the fields; the error is the field and why.
    pub(super) fn validate(&self) -> Result<(), (&'static str, String)> {
        check_endpoint(&self.endpoint).map_err(|why| ("endpoint", why))?;
        if let Some(replay) = &self.replay_endpoint {
            check_endpoint(replay).map_err(|why| ("replay_endpoint", why))?;
            if *replay == self.endpoint {
                return Err((
                    "replay_endpoint",
                    "must differ from endpoint (the PUB and the replay socket each bind their \
                     own)"
                        .to_string(),
                ));
            }
        }
        if self.hwm != KV_EVENTS_HWM {
            return Err((
                "hwm",
                format!(
                    "Peregrine's ZeroMQ publisher has a fixed high-water mark of \
                     {KV_EVENTS_HWM} messages per subscriber; leave it out or give \
                     {KV_EVENTS_HWM}, not {}",
                    self.hwm
                ),
            ));
        }
        if self.max_queue_size == 0 {
            return Err(("max_queue_size", "must be at least 1, not 0".to_string()));
        }
        Ok(())
    }
}

/// A `tcp://HOST:PORT` or `ipc://PATH` endpoint.
fn check_endpoint(endpoint: &str) -> Result<(), String> {
    if let Some(address) = endpoint.strip_prefix("tcp://") {
        let port = address.rsplit_once(':').map(|(_, port)| port);
        match port.map(str::parse::<u16>) {
            Some(Ok(_)) => Ok(()),
            _ => Err(format!(
                "{endpoint:?} has no port: write tcp://HOST:PORT, such as tcp://*:5557"
            )),
        }
    } else if endpoint
        .strip_prefix("ipc://")
        .is_some_and(|p| !p.is_empty())
    {
        Ok(())
    } else if endpoint.starts_with("inproc://") {
        Err(format!(
            "{endpoint:?}: an inproc endpoint reaches only threads of the same process; use \
             tcp:// or ipc://"
        ))
    } else {
        Err(format!(
            "{endpoint:?} is not a ZeroMQ endpoint: write tcp://HOST:PORT or ipc://PATH"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::{KvEventsConfig, KvEventsEncoding, KvEventsPublisher};

    #[test]
    fn vllm_s_example_parses_with_vllm_s_defaults() {
        let config = KvEventsConfig::from_json(
            r#"{"enable_kv_cache_events": true, "publisher": "zmq", "topic": "kv-events"}"#,
        )
        .unwrap();
        assert!(config.publishes());
        assert_eq!(config.publisher, Some(KvEventsPublisher::Zmq));
        assert_eq!(config.endpoint, "tcp://*:5557");
        assert_eq!(config.replay_endpoint, None);
        assert_eq!(config.buffer_steps, 10_000);
        assert_eq!(config.hwm, 100_000);
        assert_eq!(config.max_queue_size, 100_000);
        assert_eq!(config.topic, "kv-events");
        assert_eq!(config.encoding, KvEventsEncoding::Map);
        config.validate().unwrap();
    }

    #[test]
    fn events_are_published_only_when_enabled_and_not_null() {
        let publishes = |json: &str| KvEventsConfig::from_json(json).unwrap().publishes();
        assert!(publishes(r#"{"enable_kv_cache_events": true}"#));
        assert!(!publishes(r#"{}"#));
        assert!(!publishes(r#"{"publisher": "zmq"}"#));
        assert!(!publishes(
            r#"{"enable_kv_cache_events": true, "publisher": "null"}"#
        ));
    }

    #[test]
    fn unknown_fields_and_bad_values_are_refused_by_name() {
        let err = KvEventsConfig::from_json(r#"{"enable_kv_cache_event": true}"#).unwrap_err();
        assert!(err.contains("enable_kv_cache_event"), "{err}");
        let err = KvEventsConfig::from_json(r#"{"publisher": "kafka"}"#).unwrap_err();
        assert!(err.contains("kafka"), "{err}");
        let bad = |json: &str| {
            KvEventsConfig::from_json(json)
                .unwrap()
                .validate()
                .unwrap_err()
        };
        assert_eq!(bad(r#"{"endpoint": "tcp://*"}"#).0, "endpoint");
        assert_eq!(bad(r#"{"endpoint": "inproc://cache"}"#).0, "endpoint");
        assert_eq!(bad(r#"{"endpoint": "udp://*:1"}"#).0, "endpoint");
        assert_eq!(
            bad(r#"{"replay_endpoint": "tcp://*:5557"}"#).0,
            "replay_endpoint"
        );
        let (field, why) = bad(r#"{"hwm": 10}"#);
        assert_eq!(field, "hwm");
        assert!(why.contains("100000"), "{why}");
        assert_eq!(bad(r#"{"max_queue_size": 0}"#).0, "max_queue_size");
        KvEventsConfig::from_json(r#"{"endpoint": "ipc:///tmp/kv", "hwm": 100000}"#)
            .unwrap()
            .validate()
            .unwrap();
    }
}
