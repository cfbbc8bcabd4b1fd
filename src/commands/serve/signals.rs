//! What the server does on signals and on a change of its configuration file.

use super::reload::Reloader;
use actix_web::dev::ServerHandle;
use actix_web::web;
use notify::{RecursiveMode, Watcher};
use peregrine_actors::gateway::GatewayState;
use peregrine_actors::messages::SchedulerMsg;
use std::time::Instant;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::{mpsc, oneshot};
use tracing::{info, warn};

/// Reloads on SIGHUP and on a change of the configuration file; on SIGTERM or SIGINT stops
/// taking requests, lets in-flight ones finish within the shutdown timeout, cancels the
/// rest, then stops the HTTP server.
pub async fn watch(
    reloader: Reloader,
    state: web::Data<GatewayState>,
    scheduler: mpsc::Sender<SchedulerMsg>,
    server: ServerHandle,
    config_file: Option<std::path::PathBuf>,
) {
    let (Ok(mut hangup), Ok(mut terminate), Ok(mut interrupt)) = (
        signal(SignalKind::hangup()),
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        warn!("cannot install signal handlers");
        return;
    };
    let (changed_tx, mut changed) = mpsc::unbounded_channel();
    let _watcher = config_file.and_then(|file| watch_file(&file, changed_tx));
    loop {
        tokio::select! {
            _ = hangup.recv() => report(reloader.reload_now().await, "SIGHUP"),
            Some(()) = changed.recv() => {
                // Editors write in several steps: let the file settle, then take every
                // notification of this burst as one change.
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                while changed.try_recv().is_ok() {}
                report(reloader.reload_now().await, "file change");
            }
            _ = terminate.recv() => break,
            _ = interrupt.recv() => break,
        }
    }
    let timeout = reloader.shutdown_timeout();
    info!(?timeout, "shutting down: draining in-flight requests");
    state.stop_accepting();
    let (done, drained) = oneshot::channel();
    let deadline = Instant::now() + timeout;
    if scheduler
        .send(SchedulerMsg::Drain { deadline, done })
        .await
        .is_ok()
    {
        let _ = drained.await;
    }
    server.stop(true).await;
}

fn report(result: Result<String, String>, trigger: &str) {
    match result {
        Ok(message) => info!(trigger, "{message}"),
        Err(why) => warn!(trigger, "reload refused: {why}"),
    }
}

/// Watches the folder of `file` (editors replace files by renaming) and sends a unit on
/// every event that touches it.
fn watch_file(
    file: &std::path::Path,
    tx: mpsc::UnboundedSender<()>,
) -> Option<notify::RecommendedWatcher> {
    let file = std::fs::canonicalize(file).ok()?;
    let dir = file.parent()?.to_path_buf();
    let target = file.clone();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if let Ok(event) = event {
            if event.paths.iter().any(|p| p == &target) && !event.kind.is_access() {
                let _ = tx.send(());
            }
        }
    })
    .map_err(|e| warn!("cannot watch {}: {e}", file.display()))
    .ok()?;
    watcher
        .watch(&dir, RecursiveMode::NonRecursive)
        .map_err(|e| warn!("cannot watch {}: {e}", dir.display()))
        .ok()?;
    Some(watcher)
}
