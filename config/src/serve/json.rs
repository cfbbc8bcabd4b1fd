//! Field values as JSON, for comparing configurations and showing them. Floats go through
//! their shortest decimal form so that 0.9f32 shows as 0.9, not 0.8999999761581421.

use super::{
    DeviceKind, DtypeChoice, KvEventsConfig, KvEventsEncoding, KvEventsPublisher, SamplingDefaults,
    SpeculativeMethod, ToolCallParser,
};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::Duration;

/// A value as JSON.
pub(super) trait ToJson {
    /// This value as JSON.
    fn to_json(&self) -> Value;
}

impl ToJson for String {
    fn to_json(&self) -> Value {
        Value::from(self.as_str())
    }
}

impl ToJson for PathBuf {
    fn to_json(&self) -> Value {
        Value::from(self.display().to_string())
    }
}

impl ToJson for bool {
    fn to_json(&self) -> Value {
        Value::from(*self)
    }
}

impl ToJson for u16 {
    fn to_json(&self) -> Value {
        Value::from(*self)
    }
}

impl ToJson for i32 {
    fn to_json(&self) -> Value {
        Value::from(*self)
    }
}

impl ToJson for u64 {
    fn to_json(&self) -> Value {
        Value::from(*self)
    }
}

impl ToJson for usize {
    fn to_json(&self) -> Value {
        Value::from(*self)
    }
}

impl ToJson for f32 {
    fn to_json(&self) -> Value {
        self.to_string()
            .parse::<f64>()
            .map_or(Value::Null, Value::from)
    }
}

impl ToJson for Duration {
    /// Seconds, as the file writes them: whole ones as an integer.
    fn to_json(&self) -> Value {
        match self.subsec_nanos() {
            0 => Value::from(self.as_secs()),
            _ => Value::from(self.as_secs_f64()),
        }
    }
}

impl ToJson for SpeculativeMethod {
    fn to_json(&self) -> Value {
        Value::from(self.as_str())
    }
}

impl ToJson for ToolCallParser {
    fn to_json(&self) -> Value {
        Value::from(self.as_str())
    }
}

impl ToJson for DeviceKind {
    fn to_json(&self) -> Value {
        Value::from(self.as_str())
    }
}

impl ToJson for DtypeChoice {
    fn to_json(&self) -> Value {
        Value::from(self.as_str())
    }
}

impl<T: ToJson> ToJson for Option<T> {
    fn to_json(&self) -> Value {
        self.as_ref().map_or(Value::Null, T::to_json)
    }
}

impl<T: ToJson> ToJson for Vec<T> {
    fn to_json(&self) -> Value {
        Value::Array(self.iter().map(T::to_json).collect())
    }
}

impl ToJson for SamplingDefaults {
    fn to_json(&self) -> Value {
        let SamplingDefaults {
            temperature,
            top_p,
            top_k,
            min_p,
            repetition_penalty,
            presence_penalty,
            frequency_penalty,
            max_tokens,
        } = self;
        json!({
            "temperature": temperature.to_json(),
            "top_p": top_p.to_json(),
            "top_k": top_k.to_json(),
            "min_p": min_p.to_json(),
            "repetition_penalty": repetition_penalty.to_json(),
            "presence_penalty": presence_penalty.to_json(),
            "frequency_penalty": frequency_penalty.to_json(),
            "max_tokens": max_tokens.to_json(),
        })
    }
}

impl ToJson for KvEventsConfig {
    fn to_json(&self) -> Value {
        let KvEventsConfig {
            enable_kv_cache_events,
            publisher,
            endpoint,
            replay_endpoint,
            buffer_steps,
            hwm,
            max_queue_size,
            topic,
            encoding,
        } = self;
        json!({
            "enable_kv_cache_events": enable_kv_cache_events,
            "publisher": publisher.map(|p| match p {
                KvEventsPublisher::Null => "null",
                KvEventsPublisher::Zmq => "zmq",
            }),
            "endpoint": endpoint,
            "replay_endpoint": replay_endpoint,
            "buffer_steps": buffer_steps,
            "hwm": hwm,
            "max_queue_size": max_queue_size,
            "topic": topic,
            "encoding": match encoding {
                KvEventsEncoding::Map => "map",
                KvEventsEncoding::Array => "array",
            },
        })
    }
}
