//! How many threads one pass over a model may use: the store's apply and snapshot copy, and the
//! encodings of a pull (bf16 rounding, int8 differences).

/// Models at least this long (4 MiB of f32) are walked by several threads at once; below it a
/// thread's start costs more than it saves.
pub const PARALLEL_MIN_LEN: usize = 1 << 20;
/// The most threads one pass uses.
const MAX_THREADS: usize = 8;

/// Threads for a pass over `len` elements: as many as the cores this process may use (cgroup
/// quotas counted), at most [`MAX_THREADS`], one below [`PARALLEL_MIN_LEN`].
pub fn threads_for(len: usize) -> usize {
    if len < PARALLEL_MIN_LEN {
        return 1;
    }
    std::thread::available_parallelism().map_or(1, |n| n.get()).min(MAX_THREADS)
}

/// `items` cut into `threads` contiguous runs of about equal `weight`, each given to `f` on a
/// scoped thread of its own (the first on the caller's). Returns `f`'s answers in order.
pub fn in_runs<T: Send, R: Send>(
    items: Vec<T>,
    threads: usize,
    weight: impl Fn(&T) -> usize,
    f: impl Fn(Vec<T>) -> R + Sync,
) -> Vec<R> {
    let total: usize = items.iter().map(&weight).sum();
    let per_run = total.div_ceil(threads.max(1)).max(1);
    let mut runs = vec![Vec::new()];
    let mut filled = 0;
    for item in items {
        let w = weight(&item);
        if filled >= per_run {
            runs.push(Vec::new());
            filled = 0;
        }
        filled += w;
        runs.last_mut().expect("one run at least").push(item);
    }
    let mut runs = runs.into_iter();
    let first = runs.next().expect("one run at least");
    std::thread::scope(|scope| {
        let others: Vec<_> = runs.map(|run| scope.spawn(|| f(run))).collect();
        let mut done = vec![f(first)];
        done.extend(others.into_iter().map(|h| h.join().expect("a model pass panicked")));
        done
    })
}

/// Runs `f`, compiled with AVX2 where the CPU has it. For the loops over a model's values that
/// narrow or widen between f32 and 8- or 16-bit integers: the baseline x86-64 build has no
/// instruction for either, and such a loop runs at a fraction of the speed. The operations and
/// their order are the same in both builds (no fused multiply-add), so are the results.
#[inline(always)]
pub fn with_avx2<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        #[target_feature(enable = "avx2")]
        fn run<R>(f: impl FnOnce() -> R) -> R {
            f()
        }
        // SAFETY: the CPU supports AVX2, checked just above.
        return unsafe { run(f) };
    }
    f()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_keep_the_items_order_and_balance_their_weight() {
        let items: Vec<usize> = (0..100).collect();
        let runs = in_runs(items.clone(), 4, |_| 1, |run| run);
        assert_eq!(runs.len(), 4);
        assert!(runs.iter().all(|r| r.len() == 25), "{runs:?}");
        assert_eq!(runs.concat(), items);
        assert_eq!(in_runs(vec![7], 8, |_| 1, |run| run), vec![vec![7]]);
        assert_eq!(in_runs(Vec::<u8>::new(), 3, |_| 1, |run| run.len()), vec![0]);
    }

    #[test]
    fn small_models_stay_on_one_thread() {
        assert_eq!(threads_for(PARALLEL_MIN_LEN - 1), 1);
        assert!(threads_for(PARALLEL_MIN_LEN) >= 1);
    }
}
