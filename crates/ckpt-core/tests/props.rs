//! Property test: random sequences of submits, injected failures, crashes (a panic at a
//! failpoint leaves the disk exactly as a crash would) and restarts never leave `latest`
//! naming an invalid or missing checkpoint, and never lose the newest valid one.

use ckpt_core::{
    Engine, EngineConfig, Retention, Snapshot, failpoints, read_latest, verify_checkpoint,
    verify_root,
};
use fail::FailScenario;
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Submit,
    Fail(usize),
    Crash(usize),
    Restart,
}

fn op() -> impl Strategy<Value = Op> {
    let n = failpoints::ALL.len();
    prop_oneof![
        4 => Just(Op::Submit),
        2 => (0..n).prop_map(Op::Fail),
        2 => (0..n).prop_map(Op::Crash),
        1 => Just(Op::Restart),
    ]
}

fn open(root: &std::path::Path) -> Engine {
    Engine::open(EngineConfig::new(root).retention(Retention::keep_last(2)))
        .unwrap()
        .0
}

fn check(root: &std::path::Path, best: Option<u64>) -> Result<(), TestCaseError> {
    let latest = read_latest(root).unwrap();
    match (best, &latest) {
        (None, _) => {}
        (Some(b), None) => prop_assert!(false, "latest missing, step {} was published", b),
        (Some(b), Some(name)) => {
            let step: u64 = name.trim_start_matches("step-").parse().unwrap();
            prop_assert!(step >= b, "latest {} is older than published {}", name, b);
            prop_assert!(
                verify_checkpoint(&root.join(name)).is_ok(),
                "latest {} does not verify",
                name
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]
    #[test]
    fn latest_is_always_valid_and_newest_is_never_lost(ops in proptest::collection::vec(op(), 1..14)) {
        let scenario = FailScenario::setup();
        // Injected "crashes" are panics on the persist thread; keep their noise out of the log.
        let default_hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !info.to_string().contains("failpoint") { default_hook(info) }
        }));
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let mut engine = open(root);
        let mut step = 0u64;
        let mut best: Option<u64> = None;
        for op in ops {
            match op {
                Op::Submit | Op::Fail(_) | Op::Crash(_) => {
                    step += 1;
                    let fp = match op {
                        Op::Fail(i) => { fail::cfg(failpoints::ALL[i], "1*return").unwrap(); Some(i) }
                        Op::Crash(i) => { fail::cfg(failpoints::ALL[i], "1*panic").unwrap(); Some(i) }
                        _ => None,
                    };
                    let s = Snapshot::new(step).with_bytes("a.bin", vec![step as u8; 512]);
                    engine.submit(s).unwrap();
                    let res = engine.wait_idle();
                    if let Some(i) = fp { fail::remove(failpoints::ALL[i]); }
                    match (&op, res) {
                        (Op::Submit, r) => { r.unwrap(); best = Some(step); }
                        (Op::Fail(i), r) => {
                            // Retention fails after publication; everything else publishes nothing.
                            if failpoints::ALL[*i] == failpoints::RETENTION {
                                // Fires only when there is something to delete.
                                let _ = r;
                                let d = root.join(format!("step-{step:08}")); prop_assert!(d.exists(), "{} missing", d.display());
                                best = Some(step);
                            } else {
                                prop_assert!(r.is_err());
                                let d = root.join(format!("step-{step:08}")); prop_assert!(!d.exists(), "{} published", d.display());
                            }
                        }
                        _ => {
                            // The "process" died: restart on the same root.
                            drop(engine);
                            engine = open(root);
                        }
                    }
                }
                Op::Restart => { drop(engine); engine = open(root); }
            }
            check(root, best)?;
        }
        drop(engine);
        let (_e, report) = Engine::open(EngineConfig::new(root)).unwrap();
        check(root, best)?;
        if best.is_some() { prop_assert!(report.latest.is_some()); }
        prop_assert!(verify_root(root).is_ok());
        scenario.teardown();
    }
}
