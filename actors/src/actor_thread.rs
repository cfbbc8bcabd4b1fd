//! The OS threads of the actors whose work blocks (the TargetRunner, the DraftProposer).
//! Each drops what it drives (a model with its device buffers and graphs) before it says it
//! has stopped, so that a process can wait for that before it exits: a CUDA context torn
//! down at exit under a thread still freeing its graphs crashes the process.

use tokio::sync::oneshot;

/// Says when an actor's thread has stopped and dropped what it drove.
pub struct Stopped(oneshot::Receiver<()>);

impl Stopped {
    /// Waits for the thread to stop (it stops once every handle to it is dropped).
    pub async fn wait(self) {
        // An Err means the thread is gone without a word (it panicked): stopped too.
        let _ = self.0.await;
    }
}

/// Runs `body` on a new thread named `name`; what `body` owns is dropped when it returns,
/// before the returned [`Stopped`] fires.
pub fn spawn_actor_thread(name: &str, body: impl FnOnce() + Send + 'static) -> Stopped {
    let (done, stopped) = oneshot::channel();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            body();
            let _ = done.send(());
        })
        .unwrap_or_else(|e| panic!("spawning the {name} thread: {e}"));
    Stopped(stopped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    /// The state a thread drives is dropped before its stop is reported.
    #[tokio::test]
    async fn a_thread_reports_its_stop_after_dropping_its_state() {
        struct Flag(Arc<AtomicBool>);
        impl Drop for Flag {
            fn drop(&mut self) {
                std::thread::sleep(std::time::Duration::from_millis(50));
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let dropped = Arc::new(AtomicBool::new(false));
        let state = Flag(dropped.clone());
        let (tx, rx) = crossbeam_channel::unbounded::<()>();
        let stopped = spawn_actor_thread("test-actor", move || {
            let _state = state;
            for () in rx {}
        });
        drop(tx);
        stopped.wait().await;
        assert!(dropped.load(Ordering::SeqCst));
    }
}
