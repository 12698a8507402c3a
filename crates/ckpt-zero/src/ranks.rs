//! What the ranks of a ZeRO-1 run agree on at a step boundary, and how rank threads are
//! joined.

use ckpt_core::session::Proposal;

use crate::collective::Collective;
use crate::{Error, Result};

/// Agrees on one step boundary's [`Proposal`] over `group` (the training group; every rank
/// calls this at every boundary): every rank follows rank 0's `save` (under an overhead budget
/// or a time interval only rank 0's controller decides; at a fixed step interval all ranks
/// propose the same), and stops when any rank was asked to, so all ranks stop at the same step
/// boundary. One all-gather of two bytes per step.
pub fn agree_on_boundary(group: &mut dyn Collective, mine: Proposal) -> Result<Proposal> {
    let all = group.all_gather(&[u8::from(mine.save), u8::from(mine.stop)])?;
    let save = all.first().and_then(|r| r.first()).is_some_and(|&b| b == 1);
    let stop = all.iter().any(|r| r.get(1) == Some(&1));
    Ok(Proposal { save, stop })
}

/// What the ranks do with a memory-tier save that is due ([`agree_on_memory_save`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemorySaveVerdict {
    /// Every rank saves.
    Save,
    /// Skipped: some rank's previous memory save still runs (the tier never makes training
    /// wait).
    Busy,
    /// Skipped: over rank 0's overhead budget.
    OverBudget,
}

/// Agrees over `group` (every rank calls this when a memory save is due) on whether the ranks
/// take it: only when no rank's previous memory save still runs (`busy`), and by rank 0's
/// overhead budget (`within`), as disk saves follow rank 0's decision
/// ([`agree_on_boundary`]). Rank 0 decides alone because each rank's controller measures its
/// own steps: letting every rank veto would wait, before the first (measuring) save, for a step
/// where every rank's warm-up has settled at once, which microsecond steps on a busy machine
/// may never give. The ranks' steps are in lock-step through the collective, so rank 0's
/// account sees what every rank's save costs the run. All ranks get the same verdict.
pub fn agree_on_memory_save(
    group: &mut dyn Collective,
    busy: bool,
    within: bool,
) -> Result<MemorySaveVerdict> {
    let all = group.all_gather(&[u8::from(busy), u8::from(within)])?;
    Ok(if all.iter().any(|r| r.first() != Some(&0)) {
        MemorySaveVerdict::Busy
    } else if all.first().and_then(|r| r.get(1)) == Some(&1) {
        MemorySaveVerdict::Save
    } else {
        MemorySaveVerdict::OverBudget
    })
}

/// Joins rank threads after rank 0 (the calling thread) finished with `r0`: rank 0's own error
/// first, else the first other rank's (a panic included, as [`Error::Rank`]), else rank 0's
/// result.
pub fn join_ranks<T, E>(
    r0: std::result::Result<T, E>,
    handles: Vec<(
        usize,
        std::thread::ScopedJoinHandle<'_, std::result::Result<(), E>>,
    )>,
) -> std::result::Result<T, E>
where
    E: From<Error> + std::fmt::Display,
{
    let mut first_err = None;
    for (rank, h) in handles {
        let reason = match h.join() {
            Ok(Ok(())) => continue,
            Ok(Err(e)) => e.to_string(),
            Err(_) => "panicked".into(),
        };
        first_err.get_or_insert(Error::Rank { rank, reason });
    }
    match (r0, first_err) {
        (Ok(v), None) => Ok(v),
        (Err(e), _) => Err(e),
        (Ok(_), Some(e)) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collective::ThreadGroup;
    use std::time::Duration;

    /// The verdicts of two rank threads proposing `(busy, within)` each.
    fn verdicts(proposals: [(bool, bool); 2]) -> Vec<MemorySaveVerdict> {
        let groups = ThreadGroup::new(2, Duration::from_secs(10));
        std::thread::scope(|s| {
            let handles: Vec<_> = groups
                .into_iter()
                .zip(proposals)
                .map(|(mut g, (busy, within))| {
                    s.spawn(move || agree_on_memory_save(&mut g, busy, within).unwrap())
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn rank_0s_budget_decides_a_memory_save() {
        use MemorySaveVerdict::*;
        // Another rank over its own budget (or not settled) does not veto rank 0's save.
        assert_eq!(verdicts([(false, true), (false, false)]), [Save, Save]);
        assert_eq!(verdicts([(false, false), (false, true)]), [OverBudget; 2]);
        // A rank still saving skips it on every rank, whatever the budget says.
        assert_eq!(verdicts([(false, true), (true, true)]), [Busy; 2]);
        assert_eq!(verdicts([(true, false), (false, true)]), [Busy; 2]);
        assert_eq!(verdicts([(false, true), (false, true)]), [Save; 2]);
    }
}
