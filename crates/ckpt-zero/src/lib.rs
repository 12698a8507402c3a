//! ZeRO-1 sharding (filled by the ckpt-zero issue; nothing here yet).
