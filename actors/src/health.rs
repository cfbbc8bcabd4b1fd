//! The engine's liveness, as `GET /health` reports it: whether the last engine step
//! succeeded and whether the actors' threads still run. The scheduler records each step's
//! outcome; each actor thread holds a [`ThreadAlive`] guard that marks it dead when the
//! thread ends, by return or by panic.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Shared between the engine, which records into it, and the gateway, which reads it.
#[derive(Clone, Debug, Default)]
pub struct EngineHealth(Arc<HealthState>);

#[derive(Debug, Default)]
struct HealthState {
    /// Why the last step failed; `None` while steps succeed.
    failed_step: Mutex<Option<String>>,
    /// The actor threads, by name, each with its liveness flag.
    threads: Mutex<Vec<(String, Arc<AtomicBool>)>>,
}

impl EngineHealth {
    /// A step failed with `why`: the engine is not live until a later step succeeds.
    pub fn step_failed(&self, why: String) {
        *lock(&self.0.failed_step) = Some(why);
    }

    /// A step succeeded.
    pub fn step_succeeded(&self) {
        let mut failed = lock(&self.0.failed_step);
        if failed.is_some() {
            *failed = None;
        }
    }

    /// Watches the thread `name`, alive while `alive` is.
    pub fn watch(&self, name: &str, alive: &ThreadAlive) {
        lock(&self.0.threads).push((name.to_owned(), Arc::clone(&alive.0)));
    }

    /// `Ok` while the engine is live; else why it is not.
    pub fn check(&self) -> Result<(), String> {
        for (name, alive) in lock(&self.0.threads).iter() {
            if !alive.load(Ordering::Acquire) {
                return Err(format!("the engine's {name} thread has stopped"));
            }
        }
        match lock(&self.0.failed_step).as_ref() {
            Some(why) => Err(format!("the engine's last step failed: {why}")),
            None => Ok(()),
        }
    }
}

/// Whether an actor's thread still runs: true from its start until the thread's guard
/// ([`ThreadAlive::guard`]) is dropped.
#[derive(Clone, Debug)]
pub struct ThreadAlive(Arc<AtomicBool>);

impl ThreadAlive {
    /// A thread that is about to start.
    pub fn new() -> Self {
        Self(Arc::new(AtomicBool::new(true)))
    }

    /// Whether the thread still runs.
    pub fn is_alive(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    /// The guard the thread holds: dropping it (the thread returns or unwinds) marks the
    /// thread dead.
    pub fn guard(&self) -> AliveGuard {
        AliveGuard(Arc::clone(&self.0))
    }
}

impl Default for ThreadAlive {
    fn default() -> Self {
        Self::new()
    }
}

/// Held by a running actor thread; see [`ThreadAlive::guard`].
pub struct AliveGuard(Arc<AtomicBool>);

impl Drop for AliveGuard {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// The guarded value, even if a thread panicked while holding the lock.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_step_is_reported_until_a_step_succeeds() {
        let health = EngineHealth::default();
        assert_eq!(health.check(), Ok(()));
        health.step_failed("device fault".into());
        let why = health.check().unwrap_err();
        assert!(why.contains("device fault"), "{why}");
        health.step_succeeded();
        assert_eq!(health.check(), Ok(()));
    }

    #[test]
    fn a_thread_that_panics_is_reported_dead() {
        let health = EngineHealth::default();
        let alive = ThreadAlive::new();
        health.watch("target runner", &alive);
        let guard = alive.guard();
        let thread = std::thread::spawn(move || {
            let _guard = guard;
            panic!("injected");
        });
        assert!(thread.join().is_err());
        assert!(!alive.is_alive());
        let why = health.check().unwrap_err();
        assert!(why.contains("target runner thread has stopped"), "{why}");
    }
}
