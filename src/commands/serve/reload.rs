//! Hot reload: the whole new configuration is read and validated first, refused if it
//! changes a field that needs a restart, and only then applied to each actor by message.

use crate::commands::serve::memory::{self, graph_sizes};
use peregrine_actors::backend::{CpuFootprint, StepCapacity};
use peregrine_actors::engine::Engine;
use peregrine_actors::gateway::{AdminHooks, BoxFuture, GatewayConfig, SharedConfig};
use peregrine_actors::graphs::GraphCapture;
use peregrine_actors::messages::{SchedulerLimits, SchedulerMsg};
use peregrine_config::{ServeArgs, ServeConfig};
use peregrine_ops::sampling::SamplingParams;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tracing::{info, warn};
use tracing_subscriber::{reload, EnvFilter, Registry};

/// The scheduler's limits from a configuration.
pub fn limits(config: &ServeConfig) -> SchedulerLimits {
    SchedulerLimits {
        max_num_seqs: config.max_num_seqs,
        max_num_batched_tokens: config.max_num_batched_tokens,
        max_waiting: config.max_waiting_requests,
        num_speculative_tokens: config.num_speculative_tokens,
        speculative_adaptive: config.speculative_adaptive,
    }
}

/// The gateway's live settings from a configuration.
pub fn gateway_config(config: &ServeConfig, served_model_name: &str) -> GatewayConfig {
    let d = &config.default_sampling;
    let base = SamplingParams::default();
    GatewayConfig {
        served_model_name: served_model_name.to_string(),
        api_keys: config.api_keys.clone(),
        admin_token: config.admin_token.clone(),
        default_sampling: SamplingParams {
            temperature: d.temperature.unwrap_or(base.temperature),
            top_p: d.top_p.unwrap_or(base.top_p),
            top_k: d.top_k.unwrap_or(base.top_k),
            min_p: d.min_p.unwrap_or(base.min_p),
            repetition_penalty: d.repetition_penalty.unwrap_or(base.repetition_penalty),
            presence_penalty: d.presence_penalty.unwrap_or(base.presence_penalty),
            frequency_penalty: d.frequency_penalty.unwrap_or(base.frequency_penalty),
            ..base
        },
        default_max_tokens: d.max_tokens.map(|n| n as usize),
        max_request_body: usize::try_from(config.max_request_body).unwrap_or(usize::MAX),
        request_body_timeout: config.request_body_timeout,
        max_prompt_chars: config.max_prompt_chars,
    }
}

/// Refuses step limits (and drafts to verify) past what the engine's buffers were sized
/// for at start-up.
fn within_capacity(new: &ServeConfig, capacity: Option<StepCapacity>) -> Result<(), String> {
    let Some(c) = capacity else { return Ok(()) };
    match c.refuses(
        new.max_num_batched_tokens,
        new.max_num_seqs,
        new.drafts_per_step(),
    ) {
        Some(why) => Err(format!(
            "{why} (raising it needs a restart); the running configuration stays"
        )),
        None => Ok(()),
    }
}

/// Reloads the configuration from the same flags and file the server started with.
/// Cloning shares the same live configuration.
#[derive(Clone)]
pub struct Reloader(Arc<Live>);

/// What a reload reads and changes.
struct Live {
    args: ServeArgs,
    live: Mutex<ServeConfig>,
    served_model_name: String,
    gateway: SharedConfig,
    scheduler: mpsc::Sender<SchedulerMsg>,
    /// Captures the target's and the draft's graphs again when the sizes change.
    graphs: GraphCapture,
    log_level: reload::Handle<EnvFilter, Registry>,
    /// The largest step the engine's buffers hold (the GPU's, sized at start-up).
    capacity: Option<StepCapacity>,
    /// What the CPU backend's buffers take at given limits, to check new ones against the
    /// host's memory before they are allocated (`None` on a GPU).
    footprint: Option<CpuFootprint>,
}

impl Reloader {
    /// A reloader for a server running `live` on `engine`, whose CPU buffers take
    /// `footprint` (`None` on a GPU).
    pub fn new(
        args: ServeArgs,
        live: ServeConfig,
        served_model_name: String,
        gateway: SharedConfig,
        engine: &Engine,
        log_level: reload::Handle<EnvFilter, Registry>,
        footprint: Option<CpuFootprint>,
    ) -> Reloader {
        Reloader(Arc::new(Live {
            args,
            live: Mutex::new(live),
            served_model_name,
            gateway,
            scheduler: engine.scheduler.clone(),
            graphs: engine.graphs.clone(),
            log_level,
            capacity: engine.capacity,
            footprint,
        }))
    }

    fn live(&self) -> std::sync::MutexGuard<'_, ServeConfig> {
        self.0
            .live
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The configuration file the server reloads from, if any.
    pub fn config_file(&self) -> Option<std::path::PathBuf> {
        self.0.args.config.clone()
    }

    /// How long shutdown waits for in-flight requests, as configured now.
    pub fn shutdown_timeout(&self) -> Duration {
        self.live().shutdown_timeout
    }

    /// Reads, validates and applies the configuration; on any refusal nothing changes.
    pub async fn reload_now(&self) -> Result<String, String> {
        let new = ServeConfig::load(&self.0.args)
            .map_err(|e| format!("{e}; the running configuration stays"))?;
        let changes = self
            .live()
            .reload_changes(&new)
            .map_err(|e| e.to_string())?;
        within_capacity(&new, self.0.capacity)?;
        if let Some(footprint) = &self.0.footprint {
            memory::check_reload(&self.live(), &new, footprint)?;
        }
        let filter = EnvFilter::try_new(&new.log_level).map_err(|e| {
            format!(
                "log_level {:?}: {e}; the running configuration stays",
                new.log_level
            )
        })?;
        if changes.is_empty() {
            return Ok("configuration unchanged".to_string());
        }
        let sizes =
            graph_sizes(&new).map_err(|e| format!("{e}; the running configuration stays"))?;
        let old_sizes = graph_sizes(&self.live()).ok().flatten();
        if sizes != old_sizes {
            // On the runner's and the proposer's threads between two steps; a failed
            // capture keeps the graphs (and the configuration) that run now.
            self.0
                .graphs
                .capture(sizes)
                .await
                .map_err(|e| format!("capturing graphs: {e:#}; the running configuration stays"))?;
        }
        let (reply, applied) = oneshot::channel();
        self.0
            .scheduler
            .send(SchedulerMsg::Reconfigure(limits(&new), reply))
            .await
            .map_err(|_| "the scheduler has stopped".to_string())?;
        applied
            .await
            .map_err(|_| "the scheduler has stopped".to_string())?;
        self.0
            .gateway
            .set(gateway_config(&new, &self.0.served_model_name));
        if let Err(e) = self.0.log_level.reload(filter) {
            warn!("log level not changed: {e}");
        }
        *self.live() = new;
        let message = format!("reloaded: {}", changes.join(", "));
        info!("{message}");
        Ok(message)
    }
}

impl AdminHooks for Reloader {
    fn reload(&self) -> BoxFuture<Result<String, String>> {
        let this = self.clone();
        Box::pin(async move { this.reload_now().await })
    }

    fn live_config(&self) -> serde_json::Value {
        self.live().masked_json()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_limits_stay_within_the_buffers_sized_at_start_up() {
        let capacity = Some(StepCapacity {
            max_tokens: 2048,
            max_seqs: 64,
            max_logit_rows: 64 * 4,
        });
        let mut config = ServeConfig::default();
        assert!(within_capacity(&config, capacity).is_ok());
        config.max_num_seqs = 32;
        assert!(within_capacity(&config, capacity).is_ok());
        config.max_num_batched_tokens = 4096;
        let err = within_capacity(&config, capacity).unwrap_err();
        assert!(
            err.starts_with("max_num_batched_tokens 4096 exceeds the 2048"),
            "{err}"
        );
        assert!(within_capacity(&config, None).is_ok());
        // 64 sequences verifying 3 drafts each fit 256 logit rows; 7 drafts do not.
        config.max_num_batched_tokens = 2048;
        config.max_num_seqs = 64;
        config.speculative_method = Some(peregrine_config::SpeculativeMethod::Ngram);
        config.num_speculative_tokens = 3;
        assert!(within_capacity(&config, capacity).is_ok());
        config.num_speculative_tokens = 7;
        let err = within_capacity(&config, capacity).unwrap_err();
        assert!(
            err.starts_with("num_speculative_tokens 7 makes up to 512 logit rows"),
            "{err}"
        );
    }
}
