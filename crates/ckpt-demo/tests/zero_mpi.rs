//! ZeRO-1 over MPI: `mpirun -n 4` running the trainer with `--dist mpi` writes the same bytes
//! as 4 rank threads, with the default transport and with TCP only (`--mca btl tcp,self`).
//! Launched from `cargo test`; prints a clear SKIP when `mpirun` is missing.
#![cfg(feature = "mpi")]

mod common;

use std::path::Path;
use std::time::Duration;

use ckpt_burn::{MODEL_FILE, OPTIM_FILE, SCHEDULER_FILE, TRAINER_FILE};
use ckpt_demo::zero::{ZeroConfig, run_mpi, run_threads};
use ckpt_zero::ShardFormat;
use ckpt_zero::collective::mpi_launch::mpirun_command;

const CHILD: &str = "CKPT_ZERO_MPI_CHILD";

fn cfg(dir: &Path, ranks: usize, format: ShardFormat) -> ZeroConfig {
    let mut z = common::small(dir, ranks, 8, Duration::from_secs(60));
    z.demo.dropout = 0.2;
    z.demo.seed = 5;
    z.shard_format = format;
    z
}

/// The MPI side: one rank of the job, when launched by the parent under mpirun.
#[test]
fn mpi_child_entry() {
    let Ok(spec) = std::env::var(CHILD) else {
        return;
    };
    let (dir, format) = spec.split_once('|').unwrap();
    let c = cfg(Path::new(dir), 0, format.parse().unwrap());
    match run_mpi(&c, &mut |_| {}, |_, _| ()) {
        Ok(_) => {}
        Err(e) => {
            eprintln!("MPI-RANK-ERROR: {e}");
            std::process::exit(3);
        }
    }
}

#[test]
fn mpirun_four_ranks_match_four_threads() {
    let tmp = tempfile::tempdir().unwrap();
    for format in [ShardFormat::Consolidated, ShardFormat::PerRank] {
        let threads = tmp.path().join(format!("threads-{format}"));
        run_threads(&cfg(&threads, 4, format), &mut |_| {}).unwrap();
        for tcp in [false, true] {
            let Some(mut cmd) = mpirun_command(4, tcp) else {
                eprintln!("SKIP: mpirun not found (install openmpi-bin) or no TCP-only option");
                return;
            };
            let dir = tmp.path().join(format!("mpi-{format}-tcp{tcp}"));
            let out = cmd
                .args(["-x", CHILD])
                .arg(std::env::current_exe().unwrap())
                .args([
                    "mpi_child_entry",
                    "--exact",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(CHILD, format!("{}|{format}", dir.display()))
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "mpirun ({format}, tcp only: {tcp}) failed: {}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            for step in [4, 8] {
                let a = threads.join(ckpt_core::layout::checkpoint_dir_name(step));
                let b = dir.join(ckpt_core::layout::checkpoint_dir_name(step));
                let m = ckpt_core::verify_checkpoint(&b).unwrap();
                assert_eq!(m.world_size, 4);
                let mut names: Vec<String> = vec![
                    MODEL_FILE.into(),
                    SCHEDULER_FILE.into(),
                    TRAINER_FILE.into(),
                ];
                if format == ShardFormat::Consolidated {
                    names.push(OPTIM_FILE.into());
                } else {
                    names.extend((0..4).map(|r| ckpt_zero::shards::shard_file_name(r, 4)));
                }
                for f in names {
                    assert_eq!(
                        std::fs::read(a.join(&f)).unwrap(),
                        std::fs::read(b.join(&f)).unwrap(),
                        "{f} at step {step} ({format}, tcp only: {tcp})"
                    );
                }
            }
        }
    }
}
