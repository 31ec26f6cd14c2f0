//! The slots in which structured-output grammars compile: a bounded number of blocking
//! threads, each compile with a time limit.
//!
//! A compile cannot be interrupted (llguidance's lexer fuel bounds how long it runs, not a
//! deadline), so a compile past its time limit is refused to its request but runs on, holding
//! its slot until it ends. Hostile grammars therefore occupy at most as many threads as
//! there are slots. The wait for a slot and the compile have a time limit each: a request
//! that finds every slot taken for the limit gets 429 (the server is busy, a retry may
//! succeed), and only a compile that itself runs past the limit is the grammar's fault (400).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::timeout;

use crate::error::{ApiError, ApiResult};

/// A fixed number of slots for blocking compiles.
#[derive(Debug)]
pub struct CompileSlots {
    permits: Arc<Semaphore>,
    slots: usize,
}

impl CompileSlots {
    /// `slots` compiles at once (at least one).
    pub fn new(slots: usize) -> CompileSlots {
        let slots = slots.max(1);
        CompileSlots {
            permits: Arc::new(Semaphore::new(slots)),
            slots,
        }
    }

    /// Runs `compile` on a blocking thread once a slot is free: the wait for the slot within
    /// `limit`, then the compile within `limit`. Errors: 429 when no slot came free in time,
    /// 400 naming `field` when the compile did not end in time (it runs on in its slot), 500
    /// if the compile panicked.
    pub fn run<T, F>(
        &self,
        field: &'static str,
        limit: Duration,
        compile: F,
    ) -> impl Future<Output = ApiResult<T>> + Send + 'static
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let permits = Arc::clone(&self.permits);
        let slots = self.slots;
        async move {
            let slot = timeout(limit, permits.acquire_owned())
                .await
                .map_err(|_| ApiError::compilers_busy(slots))?
                .map_err(|e| ApiError::internal(format!("grammar compile slots closed: {e}")))?;
            let task = tokio::task::spawn_blocking(move || {
                // Freed when the compile ends, not when its request gives up on it.
                let _slot = slot;
                compile()
            });
            timeout(limit, task)
                .await
                .map_err(|_| {
                    let shown = if limit >= Duration::from_secs(1) {
                        format!("{} s", limit.as_secs())
                    } else {
                        format!("{} ms", limit.as_millis())
                    };
                    ApiError::field(field, format!("the grammar did not compile within {shown}"))
                })?
                .map_err(|e| ApiError::internal(format!("grammar compile task failed: {e}")))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use axum::http::StatusCode;

    use super::*;

    const LIMIT: Duration = Duration::from_secs(10);

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_compile_past_its_limit_keeps_its_slot_until_it_ends() {
        let slots = CompileSlots::new(1);
        let (release, hold) = mpsc::channel::<()>();
        let (ended_tx, ended) = mpsc::channel::<()>();
        let short = Duration::from_millis(200);
        let slow = slots.run("grammar", short, move || {
            hold.recv().ok();
            ended_tx.send(()).ok();
        });
        let err = slow.await.unwrap_err();
        assert_eq!(err.status, StatusCode::BAD_REQUEST);
        assert_eq!(err.param.as_deref(), Some("grammar"));
        // The slow compile still holds the only slot: the next request waits its whole
        // limit and is told the server is busy.
        let busy = slots.run("grammar", short, || 7).await.unwrap_err();
        assert_eq!(busy.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(busy.code, Some("grammar_compilers_busy"));
        // Once it ends, its slot is free again.
        release.send(()).unwrap();
        ended.recv().unwrap();
        assert_eq!(slots.run("grammar", LIMIT, || 7).await.unwrap(), 7);
    }

    /// A compile that holds a slot until the returned sender sends (or is dropped); returns
    /// once it has started, with its task.
    fn hold_a_slot(slots: &CompileSlots) -> (mpsc::Sender<()>, tokio::task::JoinHandle<bool>) {
        let (release, hold) = mpsc::channel::<()>();
        let (started_tx, started) = mpsc::channel::<()>();
        let task = tokio::spawn(slots.run("json", LIMIT, move || {
            started_tx.send(()).ok();
            hold.recv().is_ok()
        }));
        started.recv().unwrap();
        let held = async move { task.await.unwrap().unwrap() };
        (release, tokio::spawn(held))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn compiles_beyond_the_slots_wait_for_one_to_end() {
        let slots = CompileSlots::new(2);
        let (release, first) = hold_a_slot(&slots);
        // The first holds one slot; a second finds the other at once.
        assert_eq!(slots.run("json", LIMIT, || 2).await.unwrap(), 2);
        // With the first's slot and one more taken, a third waits until the first ends.
        let (release_b, second) = hold_a_slot(&slots);
        let third = tokio::spawn(slots.run("json", LIMIT, || 3));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!third.is_finished(), "the third found no free slot");
        release.send(()).unwrap();
        assert_eq!(third.await.unwrap().unwrap(), 3);
        assert!(first.await.unwrap());
        release_b.send(()).unwrap();
        assert!(second.await.unwrap());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_compile_gets_its_whole_limit_after_waiting_for_a_slot() {
        let slots = CompileSlots::new(1);
        let limit = Duration::from_millis(1000);
        let (release, first) = hold_a_slot(&slots);
        // Waits 600 ms of its 1000 for the slot, then compiles for 600 ms: each within its
        // limit, together past it.
        let second = tokio::spawn(slots.run("json", limit, || {
            std::thread::sleep(Duration::from_millis(600));
            5
        }));
        tokio::time::sleep(Duration::from_millis(600)).await;
        release.send(()).unwrap();
        assert_eq!(second.await.unwrap().unwrap(), 5);
        assert!(first.await.unwrap());
    }
}
