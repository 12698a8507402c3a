//! `ThreadGroup` behaviour on 1–4 ranks: deterministic all-reduce, chunked byte collectives,
//! isolation of split groups under concurrency, and failure (dead, stuck, mismatched ranks).

use std::sync::{Arc, Barrier, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use ckpt_zero::collective::conformance::{self, CheckResult};
use ckpt_zero::collective::{CHUNK_SIZE, Collective, CollectiveError, ThreadGroup};

/// Generous per-wait timeout for functional tests (2 shared cores, debug-ish build).
const TIMEOUT: Duration = Duration::from_secs(20);
/// A test whose ranks have not all finished after this long is considered hung.
const WATCHDOG: Duration = Duration::from_secs(240);

/// Runs `f(rank, member)` on one thread per rank and returns the results in rank order; fails
/// the test instead of hanging if the ranks do not finish within `WATCHDOG`.
fn run_ranks<T, F>(n: usize, timeout: Duration, f: F) -> Vec<T>
where
    T: Send + 'static,
    F: Fn(usize, ThreadGroup) -> T + Send + Sync + 'static,
{
    let f = Arc::new(f);
    let (tx, rx) = mpsc::channel();
    for (rank, member) in ThreadGroup::new(n, timeout).into_iter().enumerate() {
        let (f, tx) = (Arc::clone(&f), tx.clone());
        thread::spawn(move || {
            let out = f(rank, member);
            let _ = tx.send((rank, out));
        });
    }
    drop(tx);
    let deadline = Instant::now() + WATCHDOG;
    let mut out: Vec<Option<T>> = (0..n).map(|_| None).collect();
    for _ in 0..n {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((rank, v)) => out[rank] = Some(v),
            Err(mpsc::RecvTimeoutError::Timeout) => panic!("ranks hung (watchdog {WATCHDOG:?})"),
            Err(mpsc::RecvTimeoutError::Disconnected) => panic!("a rank thread panicked"),
        }
    }
    out.into_iter()
        .map(|v| v.expect("every rank reported"))
        .collect()
}

fn assert_all_ok(results: Vec<CheckResult>) {
    for (rank, r) in results.into_iter().enumerate() {
        if let Err(e) = r {
            panic!("rank {rank}: {e}");
        }
    }
}

fn check_on_ranks(ns: &[usize], check: fn(&mut dyn Collective) -> CheckResult) {
    for &n in ns {
        assert_all_ok(run_ranks(n, TIMEOUT, move |_, mut g| check(&mut g)));
    }
}

#[test]
fn members_know_rank_size_and_timeout() {
    let members = ThreadGroup::new(3, Duration::from_millis(1234));
    for (i, m) in members.iter().enumerate() {
        assert_eq!((m.rank(), m.size()), (i, 3));
        assert_eq!(m.timeout(), Duration::from_millis(1234));
    }
    assert!(ThreadGroup::new(0, TIMEOUT).is_empty());
}

#[test]
fn all_reduce_is_the_rank_ordered_tree_sum_bitwise_on_every_rank() {
    // Lengths: empty, one, small, more than one chunk of f32s.
    check_on_ranks(&[1, 2, 3, 4], |g| {
        conformance::check_all_reduce(g, &[0, 1, 1000, CHUNK_SIZE / 4 + 3], 9)
    });
}

#[test]
fn all_reduce_tree_shape_is_explicit() {
    // Independent of conformance::expected_tree_sum: spell out the specified order per size.
    for n in 1..=4usize {
        let results = run_ranks(n, TIMEOUT, move |rank, mut g| {
            let mut v = conformance::random_f32s(500 + rank as u64, 4096);
            g.all_reduce_sum_f32(&mut v).map(|()| v)
        });
        let x: Vec<Vec<f32>> = (0..n)
            .map(|r| conformance::random_f32s(500 + r as u64, 4096))
            .collect();
        let want: Vec<f32> = (0..4096)
            .map(|i| match n {
                1 => x[0][i],
                2 => x[0][i] + x[1][i],
                3 => (x[0][i] + x[1][i]) + x[2][i],
                _ => (x[0][i] + x[1][i]) + (x[2][i] + x[3][i]),
            })
            .collect();
        for (rank, r) in results.into_iter().enumerate() {
            let got = r.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
            let same = got
                .iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{n} ranks, rank {rank}: not the specified tree sum");
        }
    }
}

#[test]
fn identical_inputs_sum_to_exactly_n_times_and_divide_back() {
    check_on_ranks(&[1, 2, 3, 4], |g| {
        conformance::check_identical_inputs(g, CHUNK_SIZE / 4 + 11)
    });
}

#[test]
fn broadcast_uneven_sizes_incl_empty_and_over_chunk() {
    check_on_ranks(&[1, 2, 3, 4], conformance::check_broadcast);
}

#[test]
fn gather_uneven_sizes_incl_empty_and_over_chunk() {
    check_on_ranks(&[1, 2, 3, 4], conformance::check_gather);
}

#[test]
fn all_gather_uneven_sizes_incl_empty_and_over_chunk() {
    check_on_ranks(&[1, 2, 3, 4], conformance::check_all_gather);
}

#[test]
fn send_recv_ring_shifts_over_a_chunk_and_a_single_pair() {
    check_on_ranks(&[1, 2, 3, 4], conformance::check_send_recv);
}

#[test]
fn all_agree_and_barrier() {
    check_on_ranks(&[1, 2, 3, 4], conformance::check_agree_and_barrier);
}

#[test]
fn barrier_waits_for_the_last_rank() {
    let delay = Duration::from_millis(300);
    let results = run_ranks(3, TIMEOUT, move |rank, mut g| {
        if rank == 2 {
            thread::sleep(delay);
        }
        let t = Instant::now();
        g.barrier().map(|()| t.elapsed())
    });
    for (rank, r) in results.into_iter().enumerate().take(2) {
        let waited = r.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
        assert!(
            waited >= delay / 2,
            "rank {rank} left the barrier after {waited:?}"
        );
    }
}

#[test]
fn split_group_is_isolated_under_concurrent_use() {
    // Large gathers on the split group from background threads, concurrently with all-reduces
    // on the parent group from the rank threads, for many rounds.
    for n in [2, 3, 4] {
        assert_all_ok(run_ranks(n, TIMEOUT, |_, mut g| {
            conformance::check_split_isolation(&mut g, 12)
        }));
    }
}

#[test]
fn split_twice_and_nested_split_are_independent() {
    assert_all_ok(run_ranks(3, TIMEOUT, |rank, mut g| {
        let mut a = g.split().map_err(|e| e.to_string())?;
        let mut b = g.split().map_err(|e| e.to_string())?;
        let mut c = a.split().map_err(|e| e.to_string())?;
        // Interleave different ops on the groups: each group keeps its own sequence.
        let ga = a.all_gather(&[rank as u8; 3]).map_err(|e| e.to_string())?;
        let ok = b.all_agree(true).map_err(|e| e.to_string())?;
        let gc = c
            .all_gather(&[rank as u8 + 10])
            .map_err(|e| e.to_string())?;
        g.barrier().map_err(|e| e.to_string())?;
        let want_a: Vec<Vec<u8>> = (0..3).map(|r| vec![r as u8; 3]).collect();
        let want_c: Vec<Vec<u8>> = (0..3).map(|r| vec![r as u8 + 10]).collect();
        if ga != want_a || gc != want_c || !ok {
            return Err(format!("rank {rank}: wrong results on split groups"));
        }
        Ok(())
    }));
}

#[test]
fn full_conformance_suite() {
    for n in [1, 2, 4] {
        assert_all_ok(run_ranks(n, TIMEOUT, |_, mut g| {
            conformance::run_all(&mut g, 3)
        }));
    }
}

#[test]
fn invalid_root_is_an_invalid_argument() {
    let results = run_ranks(2, TIMEOUT, |_, mut g| {
        let gather = g.gather(2, b"x").err();
        let mut buf = Vec::new();
        let bcast = g.broadcast(5, &mut buf).err();
        (gather, bcast)
    });
    for (gather, bcast) in results {
        assert!(
            matches!(gather, Some(CollectiveError::InvalidArgument(_))),
            "{gather:?}"
        );
        assert!(
            matches!(bcast, Some(CollectiveError::InvalidArgument(_))),
            "{bcast:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Faults

/// Per-wait timeout of the fault tests.
const FAULT_TIMEOUT: Duration = Duration::from_secs(2);
/// Allowed lateness beyond the timeout (scheduling on a loaded 2-core machine).
const SLACK: Duration = Duration::from_secs(6);

/// Result of one rank in a fault scenario: the error and how long the failing call took.
type Fault = Option<(CollectiveError, Duration)>;

/// Ranks run rounds of 9 MiB gathers to `root`; `victim` leaves the group (drops its member, or
/// panics) after `survive` rounds. Returns, per rank, the first error and the failing call's
/// duration.
fn gather_with_dying_rank(n: usize, root: usize, victim: usize, panic: bool) -> Vec<Fault> {
    const SURVIVE: usize = 2;
    run_ranks(n, FAULT_TIMEOUT, move |rank, mut g| {
        let data = conformance::pattern_bytes(rank as u64, 9 << 20);
        for round in 0.. {
            if rank == victim && round == SURVIVE {
                if panic {
                    // Unwinding drops the member, like a crashed worker thread.
                    let _ = thread::spawn(move || {
                        let _owned = g;
                        panic!("injected worker crash");
                    })
                    .join();
                } else {
                    drop(g);
                }
                return None;
            }
            let t = Instant::now();
            match g.gather(root, &data) {
                Ok(_) if round < 50 => {}
                Ok(_) => panic!("rank {rank}: gathers kept succeeding without rank {victim}"),
                Err(e) => return Some((e, t.elapsed())),
            }
        }
        None
    })
}

fn assert_everyone_else_failed(results: Vec<Fault>, victim: usize) {
    for (rank, r) in results.into_iter().enumerate() {
        if rank == victim {
            continue;
        }
        let (err, took) = r.unwrap_or_else(|| panic!("rank {rank} saw no error"));
        assert!(
            matches!(
                err,
                CollectiveError::PeerGone { .. } | CollectiveError::Timeout { .. }
            ),
            "rank {rank}: unexpected error {err:?}"
        );
        assert!(
            took < FAULT_TIMEOUT + SLACK,
            "rank {rank} took {took:?} to fail: {err}"
        );
    }
}

#[test]
fn rank_that_exits_mid_gather_fails_every_other_rank_promptly() {
    let results = gather_with_dying_rank(4, 0, 2, false);
    // The root waits on the dead rank's channel: it must see it gone, not a timeout.
    match &results[0] {
        Some((CollectiveError::PeerGone { peer: 2, .. }, _)) => {}
        other => panic!("root: expected PeerGone from rank 2, got {other:?}"),
    }
    assert_everyone_else_failed(results, 2);
}

#[test]
fn root_that_exits_mid_gather_fails_every_other_rank_promptly() {
    let results = gather_with_dying_rank(4, 1, 1, false);
    assert_everyone_else_failed(results, 1);
}

#[test]
fn rank_thread_that_panics_mid_gather_fails_every_other_rank_promptly() {
    let results = gather_with_dying_rank(3, 0, 1, true);
    assert_everyone_else_failed(results, 1);
}

#[test]
fn stuck_rank_gives_timeout_not_hang() {
    let n = 3;
    let stuck = 2;
    let timeout = Duration::from_millis(800);
    let all_done = Arc::new(Barrier::new(n));
    let results = run_ranks(n, timeout, move |rank, mut g| {
        let out = if rank == stuck {
            // Alive (member held) but not calling in time.
            thread::sleep(timeout * 4);
            None
        } else {
            let mut v = vec![1.0f32; 1000];
            let t = Instant::now();
            g.all_reduce_sum_f32(&mut v).err().map(|e| (e, t.elapsed()))
        };
        // Keep every member alive until all have finished, so nobody sees PeerGone.
        all_done.wait();
        out
    });
    for (rank, r) in results.into_iter().enumerate() {
        if rank == stuck {
            continue;
        }
        let (err, took) = r.unwrap_or_else(|| panic!("rank {rank}: all_reduce succeeded"));
        match err {
            CollectiveError::Timeout {
                op, peer, after, ..
            } => {
                assert_eq!(op, "all_reduce_sum_f32");
                assert_eq!(after, timeout);
                if rank == 0 {
                    // The root waited for the stuck rank.
                    assert_eq!(peer, Some(stuck));
                } else {
                    // Rank 1 learns it from the root, or times out waiting for the root.
                    assert!(
                        peer == Some(stuck) || peer == Some(0),
                        "rank {rank}: {peer:?}"
                    );
                }
            }
            other => panic!("rank {rank}: expected Timeout, got {other:?}"),
        }
        assert!(
            took >= timeout * 9 / 10,
            "rank {rank} failed too early: {took:?}"
        );
        assert!(took < timeout + SLACK, "rank {rank} took {took:?}");
    }
}

#[test]
fn different_lengths_in_all_reduce_are_a_mismatch_on_every_rank() {
    let results = run_ranks(4, TIMEOUT, |rank, mut g| {
        let mut v = vec![1.0f32; if rank == 3 { 9 } else { 10 }];
        g.all_reduce_sum_f32(&mut v).err()
    });
    for (rank, e) in results.into_iter().enumerate() {
        assert!(
            matches!(e, Some(CollectiveError::Mismatch { .. })),
            "rank {rank}: {e:?}"
        );
    }
}

#[test]
fn ranks_calling_different_operations_get_mismatch_not_garbage() {
    let results = run_ranks(3, Duration::from_secs(3), |rank, mut g| {
        if rank == 1 {
            // Everyone else calls all_agree.
            g.gather(0, b"wrong call").err()
        } else {
            g.all_agree(true).err()
        }
    });
    assert!(
        matches!(results[0], Some(CollectiveError::Mismatch { .. })),
        "root: {:?}",
        results[0]
    );
    // Rank 2 is told by the root instead of waiting for the timeout.
    assert!(
        matches!(results[2], Some(CollectiveError::Mismatch { .. })),
        "rank 2: {:?}",
        results[2]
    );
}

#[test]
fn set_timeout_applies_to_later_calls() {
    let results = run_ranks(2, Duration::from_secs(60), |rank, mut g| {
        g.set_timeout(Duration::from_millis(200));
        assert_eq!(g.timeout(), Duration::from_millis(200));
        if rank == 1 {
            thread::sleep(Duration::from_millis(1500));
            return None;
        }
        let t = Instant::now();
        let e = g.barrier().err();
        Some((e, t.elapsed()))
    });
    let (e, took) = results[0].as_ref().expect("rank 0 result");
    assert!(matches!(e, Some(CollectiveError::Timeout { .. })), "{e:?}");
    assert!(*took < Duration::from_millis(1400), "took {took:?}");
}
