//! Helpers shared by the `ckpt` command's integration tests.

use std::process::Command;

/// Runs the `ckpt` binary; returns (exit code, stdout, stderr).
pub(crate) fn ckpt(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ckpt"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}
