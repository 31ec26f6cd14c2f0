//! A persistent worker pool. (Being written: see the kernels work item.)

/// Persistent workers that run parallel loops.
#[derive(Debug)]
pub struct ThreadPool {
    n_threads: usize,
}

impl ThreadPool {
    pub fn new(n_threads: usize) -> ThreadPool {
        ThreadPool {
            n_threads: n_threads.max(1),
        }
    }

    pub fn n_threads(&self) -> usize {
        self.n_threads
    }

    /// Runs `f(task)` for every `task < n_tasks`, spread over the workers.
    pub fn run<F: Fn(usize) + Sync>(&self, n_tasks: usize, f: F) {
        (0..n_tasks).for_each(f)
    }
}
