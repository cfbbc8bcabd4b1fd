//! The bounded pool that a request's CPU-heavy work (rendering the chat template and
//! tokenizing the prompt) runs on, off the HTTP worker threads: a 10 MB prompt takes
//! seconds to tokenize, and on a worker thread it would stall every other connection that
//! worker serves (`/health` included). At most one job per core runs at once; the rest
//! wait their turn without holding a thread.

use std::sync::Arc;

use tokio::sync::Semaphore;

use super::errors::ApiError;

/// Runs blocking jobs on tokio's blocking threads, a bounded number at a time.
#[derive(Clone, Debug)]
pub struct BlockingPool {
    permits: Arc<Semaphore>,
}

impl BlockingPool {
    /// A pool that runs at most `jobs` jobs at once (at least one).
    pub fn new(jobs: usize) -> BlockingPool {
        BlockingPool {
            permits: Arc::new(Semaphore::new(jobs.max(1))),
        }
    }

    /// A pool of one job per core.
    pub fn per_core() -> BlockingPool {
        BlockingPool::new(std::thread::available_parallelism().map_or(1, |n| n.get()))
    }

    /// Runs `work` on a blocking thread once a slot is free, and returns its result.
    pub async fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
    ) -> Result<T, ApiError> {
        let permit = Arc::clone(&self.permits)
            .acquire_owned()
            .await
            .map_err(|_| ApiError::unavailable("the tokenizer pool is closed"))?;
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            work()
        })
        .await
        .map_err(|err| ApiError::internal(format!("tokenizing the prompt failed: {err}")))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    /// Jobs run off the calling thread, never more than the pool's bound at once.
    #[tokio::test(flavor = "current_thread")]
    async fn jobs_run_off_thread_within_the_bound() {
        let pool = BlockingPool::new(2);
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let caller = std::thread::current().id();
        let jobs = (0..6).map(|i| {
            let (pool, running, most) = (pool.clone(), running.clone(), most.clone());
            async move {
                pool.run(move || {
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(30));
                    running.fetch_sub(1, Ordering::SeqCst);
                    assert_ne!(std::thread::current().id(), caller);
                    Ok(i)
                })
                .await
            }
        });
        let results = futures_util::future::join_all(jobs).await;
        let values: Vec<usize> = results.into_iter().map(Result::unwrap).collect();
        assert_eq!(values, [0, 1, 2, 3, 4, 5]);
        assert_eq!(most.load(Ordering::SeqCst), 2);
        let err = pool
            .run(|| -> Result<(), ApiError> { Err(ApiError::bad_request("no")) })
            .await
            .unwrap_err();
        assert_eq!(err.status().as_u16(), 400);
    }
}
