//! Burn integration (filled by the ckpt-burn issue).
