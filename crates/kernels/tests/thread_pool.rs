//! `ThreadPool::run`: every task exactly once, on several threads, panics propagated, no
//! deadlock under nesting, concurrency or many tiny calls; drop joins.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a test failure

use std::collections::HashSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tandem_kernels::ThreadPool;

fn run_counts(pool: &ThreadPool, n_tasks: usize) -> Vec<usize> {
    let counts: Vec<AtomicUsize> = (0..n_tasks).map(|_| AtomicUsize::new(0)).collect();
    pool.run(n_tasks, |i| {
        counts[i].fetch_add(1, Ordering::Relaxed);
    });
    counts.into_iter().map(AtomicUsize::into_inner).collect()
}

#[test]
fn every_task_runs_exactly_once() {
    for threads in [0, 1, 2, 3, 8] {
        let pool = ThreadPool::new(threads);
        assert_eq!(pool.n_threads(), threads.max(1));
        for n_tasks in [0, 1, 2, 3, 7, 64, 1000] {
            let counts = run_counts(&pool, n_tasks);
            assert_eq!(
                counts,
                vec![1; n_tasks],
                "threads {threads}, n_tasks {n_tasks}"
            );
        }
    }
}

#[test]
fn zero_tasks_never_calls_f() {
    let pool = ThreadPool::new(4);
    pool.run(0, |_| panic!("called with no tasks"));
}

#[test]
fn many_tiny_calls_in_a_row() {
    let pool = ThreadPool::new(4);
    let total = AtomicUsize::new(0);
    for call in 0..20_000usize {
        let n_tasks = call % 6; // includes 0 and 1
        pool.run(n_tasks, |i| {
            total.fetch_add(i + 1, Ordering::Relaxed);
        });
    }
    // Σ_{i<n} (i + 1) = n(n + 1)/2 per call.
    let want: usize = (0..20_000usize).map(|c| (c % 6) * (c % 6 + 1) / 2).sum();
    assert_eq!(total.into_inner(), want);
}

#[test]
fn tasks_spread_over_several_threads() {
    let pool = ThreadPool::new(4);
    let ids = Mutex::new(HashSet::new());
    pool.run(32, |_| {
        std::thread::sleep(Duration::from_millis(5));
        ids.lock().unwrap().insert(std::thread::current().id());
    });
    let ids = ids.into_inner().unwrap();
    assert!(
        ids.len() >= 2,
        "only {} thread(s) worked on 32 sleeping tasks",
        ids.len()
    );
    assert!(
        ids.contains(&std::thread::current().id()),
        "the caller works too"
    );
}

#[test]
fn a_panicking_task_propagates_and_the_pool_survives() {
    let pool = ThreadPool::new(3);
    for bad in [0usize, 5, 99] {
        let done = AtomicUsize::new(0);
        let result = catch_unwind(AssertUnwindSafe(|| {
            pool.run(100, |i| {
                if i == bad {
                    panic!("task {i} failed");
                }
                done.fetch_add(1, Ordering::Relaxed);
            })
        }));
        let payload = result.expect_err("the panic must reach the caller");
        let msg = payload.downcast_ref::<String>().expect("panic message");
        assert_eq!(msg, &format!("task {bad} failed"));
        assert_eq!(done.into_inner(), 99, "the other tasks still ran");
        assert_eq!(
            run_counts(&pool, 50),
            vec![1; 50],
            "pool usable after a panic"
        );
    }
}

#[test]
fn every_task_panicking_does_not_deadlock() {
    let pool = ThreadPool::new(4);
    let result = catch_unwind(AssertUnwindSafe(|| pool.run(64, |_| panic!("all fail"))));
    assert!(result.is_err());
    assert_eq!(run_counts(&pool, 9), vec![1; 9]);
}

#[test]
fn nested_run_does_not_deadlock() {
    let pool = ThreadPool::new(3);
    let total = AtomicUsize::new(0);
    pool.run(8, |_| {
        pool.run(5, |j| {
            total.fetch_add(j, Ordering::Relaxed);
        });
    });
    assert_eq!(total.into_inner(), 8 * (1 + 2 + 3 + 4));
}

#[test]
fn concurrent_callers_share_one_pool() {
    let pool = ThreadPool::new(3);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..3)
            .map(|_| {
                s.spawn(|| {
                    for n_tasks in 0..300 {
                        assert_eq!(run_counts(&pool, n_tasks % 17), vec![1; n_tasks % 17]);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    });
}

#[test]
fn drop_joins_idle_and_used_pools() {
    for i in 0..50 {
        let pool = ThreadPool::new(1 + i % 5);
        if i % 2 == 0 {
            assert_eq!(run_counts(&pool, 10), vec![1; 10]);
        }
        drop(pool);
    }
}

#[test]
fn tasks_borrow_the_callers_data() {
    let pool = ThreadPool::new(4);
    let input: Vec<u64> = (0..1000).collect();
    let out: Vec<AtomicUsize> = (0..10).map(|_| AtomicUsize::new(0)).collect();
    pool.run(10, |i| {
        let s: u64 = input[i * 100..(i + 1) * 100].iter().sum();
        out[i].store(s as usize, Ordering::Relaxed);
    });
    for (i, o) in out.iter().enumerate() {
        let want: u64 = (i as u64 * 100..(i as u64 + 1) * 100).sum();
        assert_eq!(o.load(Ordering::Relaxed) as u64, want);
    }
}

#[test]
fn pool_can_be_shared_and_moved_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<ThreadPool>();
    let pool = std::sync::Arc::new(ThreadPool::new(2));
    let p = std::sync::Arc::clone(&pool);
    let counts = std::thread::spawn(move || run_counts(&p, 33))
        .join()
        .unwrap();
    assert_eq!(counts, vec![1; 33]);
}
