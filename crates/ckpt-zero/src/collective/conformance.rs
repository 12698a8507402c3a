//! Behavioural checks that every [`Collective`] backend must pass.
//!
//! Each check is collective: call it with the same arguments on every rank of a group (each
//! rank with its own member). It returns `Err(description)` on the first violation instead of
//! panicking, so the same checks run for [`ThreadGroup`](super::ThreadGroup) in threads and for
//! `MpiGroup` in processes under `mpirun`. The expected values are computed independently of
//! the backends' code (inputs are deterministic functions of rank and round).

use std::thread;

use super::{CHUNK_SIZE, Collective};

/// Outcome of a check: `Err` describes the first violation.
pub type CheckResult = std::result::Result<(), String>;

/// Buffer lengths used by the byte checks: over one chunk (9 MiB + 5), empty, small, exactly one
/// chunk.
pub const LENGTHS: [usize; 4] = [9 * (1 << 20) + 5, 0, 17, CHUNK_SIZE];

/// SplitMix64 step.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Deterministic pseudo-random bytes.
pub fn pattern_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed ^ 0xA5A5_5A5A_0F0F_F0F0;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        out.extend_from_slice(&splitmix(&mut state).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Deterministic pseudo-random finite floats with full (random) 23-bit mantissas, random signs
/// and exponents in `2^-8 ..= 2^8`, so sums round and summation order matters.
pub fn random_f32s(seed: u64, len: usize) -> Vec<f32> {
    let mut state = seed;
    (0..len)
        .map(|_| {
            let r = splitmix(&mut state);
            let mantissa = (r as u32) & 0x007F_FFFF;
            let exponent = 127 - 8 + ((r >> 32) % 17) as u32;
            let sign = ((r >> 63) as u32) << 31;
            f32::from_bits(sign | (exponent << 23) | mantissa)
        })
        .collect()
}

/// The specified sum: the range of ranks `[lo, hi)` is split at
/// `lo + next_power_of_two(hi - lo) / 2`, recursively, element by element.
pub fn expected_tree_sum(inputs: &[Vec<f32>]) -> Vec<f32> {
    fn sum(inputs: &[Vec<f32>], i: usize) -> f32 {
        match inputs.len() {
            1 => inputs[0][i],
            n => {
                let mid = n.next_power_of_two() / 2;
                sum(&inputs[..mid], i) + sum(&inputs[mid..], i)
            }
        }
    }
    let len = inputs.first().map_or(0, Vec::len);
    if inputs.is_empty() {
        return Vec::new();
    }
    (0..len).map(|i| sum(inputs, i)).collect()
}

fn err<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> String + '_ {
    move |e| format!("{what}: {e}")
}

fn first_bit_difference(got: &[f32], want: &[f32]) -> Option<String> {
    if got.len() != want.len() {
        return Some(format!("length {} != {}", got.len(), want.len()));
    }
    got.iter()
        .zip(want)
        .position(|(a, b)| a.to_bits() != b.to_bits())
        .map(|i| format!("element {i}: got {:e}, want {:e}", got[i], want[i]))
}

fn f32_bytes(xs: &[f32]) -> Vec<u8> {
    xs.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Checks that every rank holds the same bytes.
fn check_same_everywhere(g: &mut dyn Collective, what: &str, bytes: &[u8]) -> CheckResult {
    let all = g.all_gather(bytes).map_err(err(what))?;
    match all.iter().position(|b| b != bytes) {
        Some(r) => Err(format!("{what}: rank {r} differs from rank {}", g.rank())),
        None => Ok(()),
    }
}

/// `all_reduce_sum_f32` of different inputs (lengths `lens`, incl. 0 and more than one chunk)
/// equals the specified tree sum bit for bit, and is identical on every rank.
pub fn check_all_reduce(g: &mut dyn Collective, lens: &[usize], seed: u64) -> CheckResult {
    let n = g.size();
    for (k, &len) in lens.iter().enumerate() {
        let seed_of = |r: usize| seed.wrapping_mul(1_000_003) + (k * 1000 + r) as u64;
        let inputs: Vec<Vec<f32>> = (0..n).map(|r| random_f32s(seed_of(r), len)).collect();
        let mut data = inputs[g.rank()].clone();
        g.all_reduce_sum_f32(&mut data)
            .map_err(err("all_reduce_sum_f32"))?;
        let want = expected_tree_sum(&inputs);
        if let Some(d) = first_bit_difference(&data, &want) {
            return Err(format!(
                "all_reduce_sum_f32 of {len} elements on {n} ranks is not the tree sum: {d}"
            ));
        }
        check_same_everywhere(g, "all_reduce result", &f32_bytes(&data))?;
    }
    Ok(())
}

/// With identical inputs `x` on every rank, the sum is the tree sum, and on a power-of-two
/// number of ranks exactly `n * x`, so `sum / n == x` bit for bit.
pub fn check_identical_inputs(g: &mut dyn Collective, len: usize) -> CheckResult {
    let n = g.size();
    let x = random_f32s(4242, len);
    let mut data = x.clone();
    g.all_reduce_sum_f32(&mut data)
        .map_err(err("all_reduce_sum_f32"))?;
    let want = expected_tree_sum(&vec![x.clone(); n]);
    if let Some(d) = first_bit_difference(&data, &want) {
        return Err(format!(
            "identical inputs on {n} ranks: not the tree sum: {d}"
        ));
    }
    if n.is_power_of_two() {
        let scaled: Vec<f32> = x.iter().map(|v| v * n as f32).collect();
        if let Some(d) = first_bit_difference(&data, &scaled) {
            return Err(format!(
                "identical inputs on {n} ranks: sum != {n} * x: {d}"
            ));
        }
        let mean: Vec<f32> = data.iter().map(|v| v / n as f32).collect();
        if let Some(d) = first_bit_difference(&mean, &x) {
            return Err(format!(
                "identical inputs on {n} ranks: sum / {n} != x: {d}"
            ));
        }
    }
    check_same_everywhere(g, "identical-input sum", &f32_bytes(&data))
}

/// Broadcast from every root, with the root's length taken from [`LENGTHS`] (incl. empty and
/// over one chunk) and non-roots starting with unrelated contents of another length.
pub fn check_broadcast(g: &mut dyn Collective) -> CheckResult {
    let me = g.rank();
    for root in 0..g.size() {
        let len = LENGTHS[root % LENGTHS.len()];
        let want = pattern_bytes(100 + root as u64, len);
        let mut data = if me == root {
            want.clone()
        } else {
            pattern_bytes(7, 3 + me)
        };
        g.broadcast(root, &mut data).map_err(err("broadcast"))?;
        if data != want {
            return Err(format!(
                "broadcast from root {root}: rank {me} got {} bytes, want {len} (or content differs)",
                data.len()
            ));
        }
    }
    Ok(())
}

fn gather_len(rank: usize, round: usize) -> usize {
    LENGTHS[(rank + round) % LENGTHS.len()]
}

fn gather_seed(rank: usize, round: usize) -> u64 {
    ((round as u64) << 16) | rank as u64
}

/// Gather to the first and the last rank, with uneven lengths (incl. empty and over one chunk).
pub fn check_gather(g: &mut dyn Collective) -> CheckResult {
    let (me, n) = (g.rank(), g.size());
    for (round, root) in [0, n - 1].into_iter().enumerate() {
        let mine = pattern_bytes(gather_seed(me, round), gather_len(me, round));
        let got = g.gather(root, &mine).map_err(err("gather"))?;
        match (me == root, got) {
            (true, Some(all)) => {
                if all.len() != n {
                    return Err(format!(
                        "gather: root got {} buffers for {n} ranks",
                        all.len()
                    ));
                }
                for (r, buf) in all.iter().enumerate() {
                    if *buf != pattern_bytes(gather_seed(r, round), gather_len(r, round)) {
                        return Err(format!(
                            "gather to {root}: buffer of rank {r} is wrong ({} bytes)",
                            buf.len()
                        ));
                    }
                }
            }
            (false, None) => {}
            (is_root, got) => {
                return Err(format!(
                    "gather to {root}: rank {me} (root: {is_root}) got {:?} buffers",
                    got.map(|v| v.len())
                ));
            }
        }
    }
    Ok(())
}

/// All-gather with uneven lengths (incl. empty and over one chunk).
pub fn check_all_gather(g: &mut dyn Collective) -> CheckResult {
    let (me, n) = (g.rank(), g.size());
    let round = 1;
    let mine = pattern_bytes(gather_seed(me, round), gather_len(me, round));
    let all = g.all_gather(&mine).map_err(err("all_gather"))?;
    if all.len() != n {
        return Err(format!(
            "all_gather: got {} buffers for {n} ranks",
            all.len()
        ));
    }
    for (r, buf) in all.iter().enumerate() {
        if *buf != pattern_bytes(gather_seed(r, round), gather_len(r, round)) {
            return Err(format!(
                "all_gather: rank {me} got a wrong buffer for rank {r}"
            ));
        }
    }
    Ok(())
}

/// `all_agree` is true iff every rank passes true; barriers complete.
pub fn check_agree_and_barrier(g: &mut dyn Collective) -> CheckResult {
    let (me, n) = (g.rank(), g.size());
    g.barrier().map_err(err("barrier"))?;
    if !g.all_agree(true).map_err(err("all_agree"))? {
        return Err("all_agree(true on all ranks) returned false".into());
    }
    for dissenter in [n - 1, 0] {
        if g.all_agree(me != dissenter).map_err(err("all_agree"))? {
            return Err(format!(
                "all_agree returned true although rank {dissenter} passed false"
            ));
        }
    }
    g.barrier().map_err(err("barrier"))?;
    Ok(())
}

/// Isolation: a group made by `split` runs `rounds` gathers of large buffers (rotating root)
/// on a background thread while this group runs all-reduces on the calling thread; both must
/// give correct results and neither may deadlock.
pub fn check_split_isolation(g: &mut dyn Collective, rounds: usize) -> CheckResult {
    let (me, n) = (g.rank(), g.size());
    let mut child = g.split().map_err(err("split"))?;
    if child.rank() != me || child.size() != n {
        return Err(format!(
            "split: got rank {}/{} for rank {me}/{n}",
            child.rank(),
            child.size()
        ));
    }
    let background = thread::spawn(move || -> CheckResult {
        for round in 0..rounds {
            let root = round % n;
            let len_of = |r: usize| 5 * (1 << 20) + 1000 * r + round;
            let mine = pattern_bytes(gather_seed(me, round + 100), len_of(me));
            let got = child.gather(root, &mine).map_err(err("split gather"))?;
            if me == root {
                let all = got.ok_or("split gather: root got None")?;
                for (r, buf) in all.iter().enumerate() {
                    if *buf != pattern_bytes(gather_seed(r, round + 100), len_of(r)) {
                        return Err(format!("split gather round {round}: rank {r} is wrong"));
                    }
                }
            }
        }
        child.barrier().map_err(err("split barrier"))
    });
    let mut result = Ok(());
    for round in 0..rounds * 3 {
        result = check_all_reduce(g, &[1000 + round], 77 + round as u64);
        if result.is_err() {
            break;
        }
    }
    let joined = background
        .join()
        .unwrap_or_else(|_| Err("split group thread panicked".into()));
    result.and(joined)
}

/// `send_recv`: every ring shift (rank r sends to r+k, receives from r-k) with buffers over a
/// chunk, which deadlocks if every rank sends first on a transport whose sends complete only
/// when received; then a single transfer between the last rank and rank 0, the others idle.
pub fn check_send_recv(g: &mut dyn Collective) -> CheckResult {
    let (me, n) = (g.rank(), g.size());
    let len_of = |r: usize, k: usize| CHUNK_SIZE + 4099 * r + k;
    for k in 1..n {
        let to = (me + k) % n;
        let from = (me + n - k) % n;
        let mine = pattern_bytes(gather_seed(me, 200 + k), len_of(me, k));
        let got = g
            .send_recv(Some(to), &mine, Some(from))
            .map_err(err("send_recv"))?;
        if got != Some(pattern_bytes(gather_seed(from, 200 + k), len_of(from, k))) {
            return Err(format!(
                "send_recv shift {k}: rank {me} got a wrong buffer from rank {from}"
            ));
        }
    }
    if n > 1 {
        let last = n - 1;
        let to = (me == last).then_some(0);
        let from = (me == 0).then_some(last);
        let got = g
            .send_recv(to, b"last to first", from)
            .map_err(err("send_recv"))?;
        let want = (me == 0).then(|| b"last to first".to_vec());
        if got != want {
            return Err(format!("send_recv pair: rank {me} got {got:?}"));
        }
    }
    Ok(())
}

/// Every check above, in a fixed order (all-reduce lengths: 0, 1, 1000, one chunk + 3).
pub fn run_all(g: &mut dyn Collective, isolation_rounds: usize) -> CheckResult {
    check_all_reduce(g, &[0, 1, 1000, CHUNK_SIZE / 4 + 3], 1)?;
    check_identical_inputs(g, CHUNK_SIZE / 4 + 11)?;
    check_broadcast(g)?;
    check_gather(g)?;
    check_all_gather(g)?;
    check_agree_and_barrier(g)?;
    check_send_recv(g)?;
    check_split_isolation(g, isolation_rounds)?;
    Ok(())
}
