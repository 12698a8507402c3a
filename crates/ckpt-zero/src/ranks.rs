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
