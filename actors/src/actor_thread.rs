//! The OS threads of the actors whose work blocks (the TargetRunner, the DraftProposer),
//! and how the engine's actors wait for each other's messages.
//! Each drops what it drives (a model with its device buffers and graphs) before it says it
//! has stopped, so that a process can wait for that before it exits: a CUDA context torn
//! down at exit under a thread still freeing its graphs crashes the process.

use crate::health::ThreadAlive;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// How long the actors of a device backend's engine poll for each other's messages before
/// they sleep: a thread woken from sleep runs tens of microseconds late (measured on an
/// H200 host: 30 us for the scheduler to see a step's result, 8 us for the runner to see
/// the next step), a few percent of a small model's decode step, while a polling one
/// sees the message at once. The scheduler waits through a step's device work (and a
/// proposal's); the runner waits through the scheduler's turn between two steps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Spin {
    /// The scheduler's wait for a step's result or a step's drafts.
    pub for_step: Duration,
    /// The runner's wait for the next step.
    pub for_next_step: Duration,
}

impl Spin {
    /// No spinning: every wait sleeps (the CPU backend, whose steps need every core).
    pub const NONE: Spin = Spin {
        for_step: Duration::ZERO,
        for_next_step: Duration::ZERO,
    };
    /// For a backend whose steps run on a device while the host only waits: a batch-1 to
    /// batch-64 decode step of a small model takes 0.4 to 2 ms, the scheduler's turn
    /// between steps 20 to 50 us. A longer wait spins this long, then sleeps.
    pub const DEVICE: Spin = Spin {
        for_step: Duration::from_millis(2),
        for_next_step: Duration::from_micros(200),
    };

    /// [`Spin::DEVICE`] where the host waits on a device for the steps
    /// (`ModelBackend::host_waits_on_device`), else [`Spin::NONE`].
    pub fn for_device(host_waits_on_device: bool) -> Spin {
        if host_waits_on_device {
            Spin::DEVICE
        } else {
            Spin::NONE
        }
    }
}

/// The next message of `rx`, polled for up to `spin` before the thread sleeps on it;
/// `None` once every sender is dropped.
pub fn recv_spinning<T>(rx: &crossbeam_channel::Receiver<T>, spin: Duration) -> Option<T> {
    let start = Instant::now();
    loop {
        match rx.try_recv() {
            Ok(msg) => return Some(msg),
            Err(crossbeam_channel::TryRecvError::Disconnected) => return None,
            Err(crossbeam_channel::TryRecvError::Empty) if start.elapsed() < spin => {
                std::hint::spin_loop()
            }
            Err(crossbeam_channel::TryRecvError::Empty) => return rx.recv().ok(),
        }
    }
}

/// The reply `rx` brings, polled for up to `spin` before the task sleeps on it. The polling
/// holds the executor thread that runs the task: the scheduler's task polls a step's
/// result this way (up to [`Spin::DEVICE`]'s 2 ms, and only with a device backend, whose
/// steps need no host core), leaving the gateway's tasks to the runtime's other workers.
/// `None` if the sender was dropped without replying.
pub async fn reply_spinning<T>(mut rx: oneshot::Receiver<T>, spin: Duration) -> Option<T> {
    let start = Instant::now();
    while start.elapsed() < spin {
        match rx.try_recv() {
            Ok(reply) => return Some(reply),
            Err(oneshot::error::TryRecvError::Empty) => std::hint::spin_loop(),
            Err(oneshot::error::TryRecvError::Closed) => return None,
        }
    }
    rx.await.ok()
}

/// Says when an actor's thread has stopped and dropped what it drove, and whether it still
/// runs.
pub struct Stopped {
    done: oneshot::Receiver<()>,
    alive: ThreadAlive,
}

impl Stopped {
    /// Waits for the thread to stop (it stops once every handle to it is dropped).
    pub async fn wait(self) {
        // An Err means the thread is gone without a word (it panicked): stopped too.
        let _ = self.done.await;
    }

    /// Whether the thread still runs: false once it returned or panicked.
    pub fn alive(&self) -> &ThreadAlive {
        &self.alive
    }
}

/// Runs `body` on a new thread named `name`; what `body` owns is dropped when it returns,
/// before the returned [`Stopped`] fires.
pub fn spawn_actor_thread(name: &str, body: impl FnOnce() + Send + 'static) -> Stopped {
    let (done, stopped) = oneshot::channel();
    let alive = ThreadAlive::new();
    let guard = alive.guard();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            body();
            drop(guard);
            let _ = done.send(());
        })
        .unwrap_or_else(|e| panic!("spawning the {name} thread: {e}"));
    Stopped {
        done: stopped,
        alive,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    /// A message that comes while the receiver spins, one that comes after it has gone to
    /// sleep, and the senders' end all reach it.
    #[test]
    fn a_spinning_receiver_gets_messages_before_and_after_its_spin() {
        let (tx, rx) = crossbeam_channel::unbounded::<u32>();
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(5));
            tx.send(1).unwrap();
            std::thread::sleep(Duration::from_millis(60));
            tx.send(2).unwrap();
        });
        let spin = Duration::from_millis(30);
        assert_eq!(recv_spinning(&rx, spin), Some(1));
        assert_eq!(recv_spinning(&rx, spin), Some(2));
        assert_eq!(recv_spinning(&rx, spin), None);
        sender.join().unwrap();
    }

    /// A reply that comes while the task spins, one that comes after, and a dropped sender.
    #[tokio::test]
    async fn a_spinning_task_gets_replies_before_and_after_its_spin() {
        let spin = Duration::from_millis(30);
        for delay in [5, 60] {
            let (tx, rx) = oneshot::channel();
            let sender = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(delay));
                tx.send(delay).unwrap();
            });
            assert_eq!(reply_spinning(rx, spin).await, Some(delay));
            sender.join().unwrap();
        }
        let (tx, rx) = oneshot::channel::<u64>();
        drop(tx);
        assert_eq!(reply_spinning(rx, spin).await, None);
    }

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
        assert!(stopped.alive().is_alive());
        drop(tx);
        let alive = stopped.alive().clone();
        stopped.wait().await;
        assert!(dropped.load(Ordering::SeqCst));
        assert!(!alive.is_alive());
    }

    /// A thread that panics is reported dead, and its stop still fires.
    #[tokio::test]
    async fn a_thread_that_panics_is_not_alive() {
        let (tx, rx) = crossbeam_channel::unbounded::<()>();
        let stopped = spawn_actor_thread("test-actor", move || {
            rx.recv().unwrap();
            panic!("injected");
        });
        tx.send(()).unwrap();
        let alive = stopped.alive().clone();
        stopped.wait().await;
        assert!(!alive.is_alive());
    }
}
