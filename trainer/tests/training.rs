//! Training behaviour through the library API: every model learns, an interrupted-and-resumed
//! run is bit-for-bit the uninterrupted one, foreign or damaged checkpoints are refused by name,
//! and every line printed is a progress line by the contract's own parser.

use std::path::Path;

use converge_contract::{CheckpointEvent, Direction, ProgressLine, parse_line};
use converge_trainer::checkpoint::{self, FILE_NAME};
use converge_trainer::{Config, Error, Metric, ModelKind, Outcome, train};

/// Steps per model in these tests: enough for each curve's fast phase in a debug build
/// (a few seconds each on one core).
fn test_steps(m: ModelKind) -> u64 {
    match m {
        ModelKind::MlpDigits => 300,
        ModelKind::CnnDigits => 200,
        ModelKind::LogregWine => 200,
        ModelKind::VaeDigits => 300,
        ModelKind::GruCo2 => 100,
    }
}

fn config(m: ModelKind, dir: Option<&Path>) -> Config {
    let mut c = Config::new(m);
    c.steps = test_steps(m);
    c.report_every = 10;
    c.seed = 7;
    c.checkpoint_dir = dir.map(Path::to_path_buf);
    c
}

/// Runs `cfg`, stopping before step `stop_at` if given; returns the outcome and parsed lines.
fn run(cfg: &Config, stop_at: Option<u64>) -> Result<(Outcome, Vec<ProgressLine>), Error> {
    let mut out = Vec::new();
    let outcome = train(cfg, &|s| stop_at.is_some_and(|k| s >= k), &mut out)?;
    let text = String::from_utf8(out).expect("utf-8 output");
    let lines = text
        .lines()
        .map(|l| {
            parse_line(l, Some(cfg.metric.name()))
                .unwrap_or_else(|e| panic!("line {l:?} does not parse: {e}"))
                .unwrap_or_else(|| panic!("line {l:?} is not a progress line"))
        })
        .collect();
    Ok((outcome, lines))
}

#[test]
fn every_model_improves_its_held_out_loss() {
    // Margin: the mean of the last five reported losses is at most 70% of the mean of the
    // first five (a 30% improvement). Every model clears it by a wide margin at these steps.
    const WINDOW: usize = 5;
    const MAX_RATIO: f64 = 0.7;
    for m in ModelKind::ALL {
        let (outcome, lines) = run(&config(m, None), None).unwrap();
        assert!(outcome.finished);
        let values: Vec<f64> = lines.iter().filter_map(|l| l.value).collect();
        assert!(
            values.len() >= 2 * WINDOW,
            "{}: {} values",
            m.name(),
            values.len()
        );
        let mean = |w: &[f64]| w.iter().sum::<f64>() / w.len() as f64;
        let first = mean(&values[..WINDOW]);
        let last = mean(&values[values.len() - WINDOW..]);
        eprintln!(
            "{}: first window {first:.4}, last window {last:.4}",
            m.name()
        );
        assert!(
            last <= MAX_RATIO * first,
            "{}: last window {last} is not 30% below first window {first}",
            m.name()
        );
    }
}

#[test]
fn classifiers_report_held_out_accuracy_to_maximize() {
    // Margin: the mean of the last five reported accuracies closes at least half of the gap
    // between the mean of the first five and a perfect 1.0 (wine starts high: it is easy).
    for m in ModelKind::ALL.into_iter().filter(|m| m.is_classifier()) {
        let mut cfg = config(m, None);
        cfg.metric = Metric::Accuracy;
        let (_, lines) = run(&cfg, None).unwrap();
        assert!(
            lines
                .iter()
                .all(|l| l.direction == Some(Direction::Maximize)
                    && l.metric.as_deref() == Some("accuracy"))
        );
        let values: Vec<f64> = lines.iter().filter_map(|l| l.value).collect();
        assert!(values.iter().all(|v| (0.0..=1.0).contains(v)), "{values:?}");
        let mean = |w: &[f64]| w.iter().sum::<f64>() / w.len() as f64;
        let first = mean(&values[..5]);
        let last = mean(&values[values.len() - 5..]);
        eprintln!(
            "{}: accuracy first window {first:.3}, last window {last:.3}",
            m.name()
        );
        assert!(
            last >= first + 0.5 * (1.0 - first),
            "{}: {first} -> {last}",
            m.name()
        );
    }
}

#[test]
fn interrupted_and_resumed_training_is_exactly_the_uninterrupted_run() {
    // Exact equality, no tolerance: weights, Adam moments and the step are restored bit for bit,
    // and every random draw is a function of (seed, step), so the resumed run performs the same
    // float operations in the same order (one thread, so no reduction-order differences).
    for m in ModelKind::ALL {
        let steps = test_steps(m);
        // Stop mid-epoch and off the reporting grid, the least convenient place.
        let stop_at = steps / 2 + 3;
        let a_dir = tempfile::tempdir().unwrap();
        let (a, _) = run(&config(m, Some(a_dir.path())), None).unwrap();

        let b_dir = tempfile::tempdir().unwrap();
        let cfg = config(m, Some(b_dir.path()));
        let (b1, b1_lines) = run(&cfg, Some(stop_at)).unwrap();
        assert!(!b1.finished);
        assert_eq!(b1.step, stop_at);
        let saved = b1_lines.last().unwrap();
        assert_eq!(saved.checkpoint, Some(CheckpointEvent::Saved));
        assert_eq!(saved.step, stop_at);
        assert!(saved.checkpoint_bytes.unwrap() > 0);

        let (b2, b2_lines) = run(&cfg, None).unwrap();
        assert_eq!(b2.restored_from, Some(stop_at));
        let first = &b2_lines[0];
        assert_eq!(first.checkpoint, Some(CheckpointEvent::Restored));
        assert_eq!(first.step, stop_at, "the step counter continues");
        assert!(first.elapsed_s.unwrap() >= saved.elapsed_s.unwrap());

        assert_eq!(b2.step, a.step, "{}", m.name());
        assert_eq!(
            a.last_value.unwrap().to_bits(),
            b2.last_value.unwrap().to_bits(),
            "{}: final loss {:?} vs resumed {:?}",
            m.name(),
            a.last_value,
            b2.last_value
        );
        // And the whole final state, not just the metric.
        let ca = checkpoint::load(&a_dir.path().join(FILE_NAME)).unwrap();
        let cb = checkpoint::load(&b_dir.path().join(FILE_NAME)).unwrap();
        assert_eq!(ca.header.step, cb.header.step);
        assert_eq!(ca.header.adam_t, cb.header.adam_t);
        assert_eq!(ca.tensors.len(), cb.tensors.len());
        for (name, ta) in &ca.tensors {
            let va = ta.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let vb = cb.tensors[name]
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            assert!(
                va.iter().zip(&vb).all(|(x, y)| x.to_bits() == y.to_bits()),
                "{}: tensor {name} differs",
                m.name()
            );
        }
    }
}

#[test]
fn a_corrupt_checkpoint_is_refused_not_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(ModelKind::LogregWine, Some(dir.path()));
    run(&cfg, Some(20)).unwrap();
    let path = dir.path().join(FILE_NAME);
    let mut bytes = std::fs::read(&path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&path, &bytes).unwrap();

    let err = run(&cfg, None).unwrap_err();
    assert!(matches!(err, Error::CorruptCheckpoint { .. }), "{err}");
    assert_eq!(err.exit_code(), 65);
    assert!(err.to_string().contains("checksum"), "{err}");
    // The damaged file is left for a human to look at, not overwritten by a fresh run.
    assert_eq!(std::fs::read(&path).unwrap(), bytes);

    std::fs::write(&path, &bytes[..bytes.len() / 3]).unwrap();
    assert!(matches!(
        run(&cfg, None),
        Err(Error::CorruptCheckpoint { .. })
    ));
    std::fs::write(&path, b"not a checkpoint at all").unwrap();
    assert!(matches!(
        run(&cfg, None),
        Err(Error::CorruptCheckpoint { .. })
    ));
}

#[test]
fn another_models_checkpoint_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    run(&config(ModelKind::LogregWine, Some(dir.path())), Some(5)).unwrap();
    let err = run(&config(ModelKind::MlpDigits, Some(dir.path())), None).unwrap_err();
    match &err {
        Error::WrongModel {
            found, expected, ..
        } => {
            assert_eq!(found, "logreg-wine");
            assert_eq!(expected, "mlp-digits");
        }
        other => panic!("expected WrongModel, got {other}"),
    }
}

#[test]
fn a_checkpoint_from_a_different_batch_size_or_seed_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(ModelKind::LogregWine, Some(dir.path()));
    run(&cfg, Some(5)).unwrap();
    let mut other = cfg.clone();
    other.batch = 8;
    let err = run(&other, None).unwrap_err();
    assert!(
        matches!(
            err,
            Error::ConfigMismatch {
                flag: "--batch",
                ..
            }
        ),
        "{err}"
    );
    let mut other = cfg.clone();
    other.seed += 1;
    assert!(matches!(
        run(&other, None),
        Err(Error::ConfigMismatch { flag: "--seed", .. })
    ));
}

#[test]
fn progress_lines_keep_the_contract() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(ModelKind::MlpDigits, Some(dir.path()));
    cfg.steps = 50;
    cfg.checkpoint_every = 20;
    let (_, lines) = run(&cfg, None).unwrap();
    // Every line: step, total_steps, metric name, direction, elapsed; value except on saves.
    for l in &lines {
        assert_eq!(l.total_steps, Some(50));
        assert_eq!(l.metric.as_deref(), Some("loss"));
        assert_eq!(l.direction, Some(Direction::Minimize));
        assert!(l.elapsed_s.is_some());
        assert!(l.value.is_some() || l.checkpoint == Some(CheckpointEvent::Saved));
    }
    let steps: Vec<u64> = lines.iter().map(|l| l.step).collect();
    assert!(steps.windows(2).all(|w| w[0] <= w[1]), "{steps:?}");
    let saves: Vec<u64> = lines
        .iter()
        .filter(|l| l.checkpoint == Some(CheckpointEvent::Saved))
        .map(|l| l.step)
        .collect();
    assert_eq!(saves, vec![20, 40, 50], "periodic saves and the final one");
    let last = lines.last().unwrap();
    assert!(last.done && last.step == 50 && last.value.is_some());
    assert_eq!(lines.iter().filter(|l| l.done).count(), 1);

    // A finished job started again reports done at once instead of training anew.
    let (again, lines) = run(&cfg, None).unwrap();
    assert!(again.finished);
    assert_eq!(again.restored_from, Some(50));
    assert!(lines.last().unwrap().done);
}
