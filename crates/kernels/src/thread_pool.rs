//! A persistent worker pool for the kernels' parallel loops.
//!
//! [`ThreadPool::new`] starts `n_threads − 1` workers once; [`ThreadPool::run`] hands them a
//! job (a borrowed closure and a task count) and the calling thread works on it too. Dispatch
//! costs no allocation and no thread creation: the caller publishes the job by bumping a
//! generation counter, the workers claim task indices from an atomic counter, and idle workers
//! spin briefly before sleeping on a condition variable.
//!
//! Protocol (all counters live in [`Shared`]):
//! - the caller, holding `run_lock`, writes the job, resets `next`/`done`, then publishes it by
//!   storing the new `generation`;
//! - a worker that sees a new generation `g` enters it (`in_job += 1`) and only then checks that
//!   `g` is not yet `closed`; if it is open it claims tasks until they run out, then leaves;
//! - the caller works on tasks, waits until `done == n_tasks`, stores `closed = g` and waits
//!   until `in_job == 0`. After that no worker can still read the job or the closure, so `run`
//!   may return and the closure's borrow ends.
//!
//! The `in_job`/`closed` pair is a Dekker handshake (both sides write one then read the other,
//! all `SeqCst`): either the caller sees the worker inside, and waits, or the worker sees the
//! job closed, and never touches it. The caller therefore never waits for a worker that is
//! asleep or descheduled before it entered the job.
//!
//! A panic in a task is caught, the remaining tasks still run, and the first payload is re-raised
//! on the calling thread once every worker has left the job.

use std::any::Any;
use std::cell::UnsafeCell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, TryLockError};
use std::thread::JoinHandle;

/// Polls of a shared counter before a waiting thread starts yielding / sleeping: about
/// 10–200 µs depending on the CPU's `pause` latency; long enough to bridge the gap between
/// two kernels of a layer, short enough not to burn a core when the engine is idle.
const SPIN_POLLS: u32 = 1 << 12;

/// A type-erased `&F` where `F: Fn(usize) + Sync`, valid while its job is open.
#[derive(Clone, Copy)]
struct Job {
    data: *const (),
    call: unsafe fn(*const (), usize),
    n_tasks: usize,
}

/// # Safety
/// `data` must point to a live `F`, shared across threads (`F: Sync`).
unsafe fn call_erased<F: Fn(usize) + Sync>(data: *const (), task: usize) {
    // SAFETY: guaranteed by the caller.
    let f = unsafe { &*data.cast::<F>() };
    f(task);
}

struct Shared {
    /// Written only by the caller holding `run_lock` while no worker is in a job.
    job: UnsafeCell<Job>,
    generation: AtomicUsize,
    closed: AtomicUsize,
    in_job: AtomicUsize,
    next: AtomicUsize,
    done: AtomicUsize,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    shutdown: AtomicBool,
    /// Number of workers asleep (or about to be) on `wake`; changed under `sleep_lock`.
    sleepers: AtomicUsize,
    sleep_lock: Mutex<()>,
    wake: Condvar,
}

// SAFETY: every field is Sync except `job`, whose accesses follow the protocol in the module
// docs: it is written only when no worker can read it, and `Job::data` points to an `F: Sync`.
unsafe impl Sync for Shared {}
// SAFETY: as above; the raw pointer in `job` is only dereferenced under that protocol.
unsafe impl Send for Shared {}

/// Persistent workers that run parallel loops; see the module docs.
pub struct ThreadPool {
    n_threads: usize,
    shared: Arc<Shared>,
    /// Held for the duration of one `run`; a concurrent or nested `run` runs inline instead.
    run_lock: Mutex<()>,
    workers: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadPool")
            .field("n_threads", &self.n_threads)
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing guarded by these mutexes can be left half-updated by a panic.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Waits (spinning, then yielding) until `ready()`.
fn wait_until(ready: impl Fn() -> bool) {
    let mut polls = 0u32;
    while !ready() {
        if polls < SPIN_POLLS {
            polls += 1;
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

impl ThreadPool {
    /// A pool of `n_threads` threads in all: the caller of [`run`](Self::run) plus
    /// `n_threads − 1` workers started now. `0` is treated as `1`.
    ///
    /// Panics if the operating system cannot start a thread.
    pub fn new(n_threads: usize) -> ThreadPool {
        let n_threads = n_threads.max(1);
        let shared = Arc::new(Shared {
            job: UnsafeCell::new(Job {
                data: std::ptr::null(),
                call: call_erased::<fn(usize)>,
                n_tasks: 0,
            }),
            generation: AtomicUsize::new(0),
            closed: AtomicUsize::new(0),
            in_job: AtomicUsize::new(0),
            next: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            panic: Mutex::new(None),
            shutdown: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            sleep_lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let workers = (1..n_threads)
            .map(|i| {
                let shared = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("tandem-worker-{i}"))
                    .spawn(move || worker_loop(&shared))
                    .expect("the OS must be able to start the pool's worker threads")
            })
            .collect();
        ThreadPool {
            n_threads,
            shared,
            run_lock: Mutex::new(()),
            workers,
        }
    }

    /// Threads that work on a job, including the caller of [`run`](Self::run).
    pub fn n_threads(&self) -> usize {
        self.n_threads
    }

    /// Runs `f(task)` exactly once for every `task < n_tasks`, spread over the workers and the
    /// calling thread, and returns when all have finished. If a task panics, the other tasks
    /// still run and the panic is then resumed on the caller.
    ///
    /// A `run` issued while another is in progress on this pool (from another thread or from
    /// inside a task) runs its tasks inline on its own thread.
    pub fn run<F: Fn(usize) + Sync>(&self, n_tasks: usize, f: F) {
        if n_tasks <= 1 || self.workers.is_empty() {
            (0..n_tasks).for_each(f);
            return;
        }
        let _guard = match self.run_lock.try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => {
                (0..n_tasks).for_each(f);
                return;
            }
        };
        let sh = &*self.shared;
        // Every previous job is closed and no worker is in one (the previous `run` waited for
        // `in_job == 0` before releasing `run_lock`), so nobody reads `job` now.
        // SAFETY: exclusive access per the above.
        unsafe {
            *sh.job.get() = Job {
                data: std::ptr::from_ref(&f).cast(),
                call: call_erased::<F>,
                n_tasks,
            };
        }
        sh.next.store(0, SeqCst);
        sh.done.store(0, SeqCst);
        let generation = sh.generation.load(SeqCst).wrapping_add(1);
        sh.generation.store(generation, SeqCst);
        if sh.sleepers.load(SeqCst) > 0 {
            let _sleep = lock(&sh.sleep_lock);
            sh.wake.notify_all();
        }
        // SAFETY: the job was just written for `f`, which outlives this call.
        unsafe { work_on(sh, *sh.job.get()) };
        wait_until(|| sh.done.load(SeqCst) == n_tasks);
        sh.closed.store(generation, SeqCst);
        wait_until(|| sh.in_job.load(SeqCst) == 0);
        if let Some(payload) = lock(&sh.panic).take() {
            resume_unwind(payload);
        }
    }
}

/// Claims and runs tasks of `job` until none are left, catching panics into `sh.panic`.
///
/// # Safety
/// `job` must be the open job: its closure stays alive until this returns.
unsafe fn work_on(sh: &Shared, job: Job) {
    loop {
        let task = sh.next.fetch_add(1, SeqCst);
        if task >= job.n_tasks {
            return;
        }
        // SAFETY: the job is open, so `job.data` points to the live closure of its type.
        let result = catch_unwind(AssertUnwindSafe(|| unsafe { (job.call)(job.data, task) }));
        if let Err(payload) = result {
            lock(&sh.panic).get_or_insert(payload);
        }
        sh.done.fetch_add(1, SeqCst);
    }
}

/// Waits until `generation` differs from `seen` (spinning, then sleeping) and returns it, or
/// returns `None` on shutdown.
fn wait_for_job(sh: &Shared, seen: usize) -> Option<usize> {
    for _ in 0..SPIN_POLLS {
        if sh.shutdown.load(SeqCst) {
            return None;
        }
        let g = sh.generation.load(SeqCst);
        if g != seen {
            return Some(g);
        }
        std::hint::spin_loop();
    }
    let mut guard = lock(&sh.sleep_lock);
    sh.sleepers.fetch_add(1, SeqCst);
    let result = loop {
        // Re-checked after announcing the sleep: a caller that published before it sees
        // `sleepers > 0` and notifies under `sleep_lock`, which we hold until `wait`.
        if sh.shutdown.load(SeqCst) {
            break None;
        }
        let g = sh.generation.load(SeqCst);
        if g != seen {
            break Some(g);
        }
        guard = sh.wake.wait(guard).unwrap_or_else(PoisonError::into_inner);
    };
    sh.sleepers.fetch_sub(1, SeqCst);
    result
}

fn worker_loop(sh: &Shared) {
    let mut seen = 0;
    while let Some(g) = wait_for_job(sh, seen) {
        seen = g;
        sh.in_job.fetch_add(1, SeqCst);
        if sh.closed.load(SeqCst) < g {
            // Job `g` is open: jobs are closed in order before the next is published, so
            // `closed < g` means `g` is the latest job; it stays open while we are in it.
            // SAFETY: see the module docs: `job` holds job `g` and its closure is alive.
            unsafe { work_on(sh, *sh.job.get()) };
        }
        sh.in_job.fetch_sub(1, SeqCst);
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, SeqCst);
        {
            let _sleep = lock(&self.shared.sleep_lock);
            self.shared.wake.notify_all();
        }
        for worker in self.workers.drain(..) {
            // A worker cannot panic (tasks are caught), so a join error is not expected;
            // ignoring it keeps a drop during unwinding from aborting.
            let _ = worker.join();
        }
    }
}
