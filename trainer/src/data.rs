//! The datasets, embedded in the binary (`trainer/data/`, provenance in its README): nothing
//! is read from disk or downloaded at run time, so a `FROM scratch` image trains as is.
//!
//! Each dataset is parsed once per process and split into training and held-out rows by a
//! fixed permutation (the same for every `--seed`), so held-out metrics of different runs are
//! comparable.

use std::io::Read;
use std::sync::OnceLock;

use rand::seq::SliceRandom;

use crate::error::{Error, Result};
use crate::rng::{Purpose, stream};

const DIGITS_GZ: &[u8] = include_bytes!("../data/digits.csv.gz");
const WINE_CSV: &[u8] = include_bytes!("../data/wine_data.csv");
const CO2_GZ: &[u8] = include_bytes!("../data/co2.csv.gz");

/// Held-out rows of the digits set (of 1,797).
pub const DIGITS_EVAL_ROWS: usize = 297;
/// Held-out rows of the wine set (of 178).
pub const WINE_EVAL_ROWS: usize = 36;
/// Weeks of CO2 history the sequence model sees per prediction.
pub const CO2_WINDOW: usize = 32;
/// Fraction of the CO2 windows, the latest ones, held out.
pub const CO2_EVAL_FRACTION: f64 = 0.2;

/// A classification dataset, row-major.
#[derive(Debug, Clone)]
pub struct Classification {
    /// Features per row.
    pub features: usize,
    /// Number of classes.
    pub classes: usize,
    /// Training rows (`train_y.len() * features` values).
    pub train_x: Vec<f32>,
    /// Training labels.
    pub train_y: Vec<u32>,
    /// Held-out rows.
    pub eval_x: Vec<f32>,
    /// Held-out labels.
    pub eval_y: Vec<u32>,
}

/// A one-step-ahead forecasting dataset: windows of a series and the value after each.
#[derive(Debug, Clone)]
pub struct Forecast {
    /// Values per window.
    pub window: usize,
    /// Training windows (`train_y.len() * window` values).
    pub train_x: Vec<f32>,
    /// Training targets.
    pub train_y: Vec<f32>,
    /// Held-out windows (the latest part of the series).
    pub eval_x: Vec<f32>,
    /// Held-out targets.
    pub eval_y: Vec<f32>,
}

/// sklearn's 8x8 handwritten digits (pixels 0..16 scaled to 0..1), 1,500 training rows.
pub fn digits() -> Result<&'static Classification> {
    static CELL: OnceLock<Result<Classification, String>> = OnceLock::new();
    cached(&CELL, "digits.csv.gz", || {
        let text = gunzip(DIGITS_GZ)?;
        let mut rows = Vec::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let v = numbers(line)?;
            if v.len() != 65 {
                return Err(format!("a row has {} fields, expected 65", v.len()));
            }
            let feats: Vec<f32> = v[..64].iter().map(|&p| (p / 16.0) as f32).collect();
            rows.push((feats, label(v[64], 10)?));
        }
        split_classification(rows, 64, 10, DIGITS_EVAL_ROWS, |_| {})
    })
}

/// UCI wine recognition (13 chemical measurements, 3 cultivars), standardized with the
/// training rows' mean and deviation, 142 training rows.
pub fn wine() -> Result<&'static Classification> {
    static CELL: OnceLock<Result<Classification, String>> = OnceLock::new();
    cached(&CELL, "wine_data.csv", || {
        let text = std::str::from_utf8(WINE_CSV).map_err(|e| e.to_string())?;
        let mut rows = Vec::new();
        // The first line is sklearn's header: `178,13,class_0,class_1,class_2`.
        for line in text.lines().skip(1).filter(|l| !l.trim().is_empty()) {
            let v = numbers(line)?;
            if v.len() != 14 {
                return Err(format!("a row has {} fields, expected 14", v.len()));
            }
            let feats: Vec<f32> = v[..13].iter().map(|&x| x as f32).collect();
            rows.push((feats, label(v[13], 3)?));
        }
        split_classification(rows, 13, 3, WINE_EVAL_ROWS, standardize)
    })
}

/// Weekly Mauna Loa CO2 (1958-2001). Each sample is [`CO2_WINDOW`] weeks and the next week's
/// value, all relative to the window's mean and scaled by the training targets' deviation, so
/// the model learns the seasonal shape rather than the absolute level. Missing weeks are
/// filled by linear interpolation. The latest [`CO2_EVAL_FRACTION`] of windows is held out.
pub fn co2() -> Result<&'static Forecast> {
    static CELL: OnceLock<Result<Forecast, String>> = OnceLock::new();
    cached(&CELL, "co2.csv.gz", || {
        let text = gunzip(CO2_GZ)?;
        let mut series: Vec<Option<f64>> = Vec::new();
        for line in text.lines().skip(1).filter(|l| !l.trim().is_empty()) {
            let (_, value) = line.split_once(',').ok_or("a row has no comma")?;
            let value = value.trim();
            series.push(if value.is_empty() {
                None
            } else {
                Some(
                    value
                        .parse::<f64>()
                        .map_err(|e| format!("`{value}`: {e}"))?,
                )
            });
        }
        let series = interpolate(&series)?;
        let w = CO2_WINDOW;
        let mut xs = Vec::new();
        let mut ys = Vec::new();
        for start in 0..series.len() - w {
            let win = &series[start..start + w];
            let mean = win.iter().sum::<f64>() / w as f64;
            xs.push(win.iter().map(|v| v - mean).collect::<Vec<_>>());
            ys.push(series[start + w] - mean);
        }
        let n_eval = (ys.len() as f64 * CO2_EVAL_FRACTION).round() as usize;
        let n_train = ys.len() - n_eval;
        let mean = ys[..n_train].iter().sum::<f64>() / n_train as f64;
        let sd = (ys[..n_train]
            .iter()
            .map(|y| (y - mean).powi(2))
            .sum::<f64>()
            / n_train as f64)
            .sqrt();
        let scale = |v: f64| (v / sd) as f32;
        let flat = |rows: &[Vec<f64>]| rows.iter().flatten().map(|&v| scale(v)).collect();
        Ok(Forecast {
            window: w,
            train_x: flat(&xs[..n_train]),
            train_y: ys[..n_train].iter().map(|&v| scale(v)).collect(),
            eval_x: flat(&xs[n_train..]),
            eval_y: ys[n_train..].iter().map(|&v| scale(v)).collect(),
        })
    })
}

fn cached<T>(
    cell: &'static OnceLock<Result<T, String>>,
    name: &'static str,
    parse: impl FnOnce() -> Result<T, String>,
) -> Result<&'static T> {
    cell.get_or_init(parse)
        .as_ref()
        .map_err(|why| Error::Dataset {
            name,
            why: why.clone(),
        })
}

fn gunzip(bytes: &[u8]) -> Result<String, String> {
    let mut out = String::new();
    flate2::read::GzDecoder::new(bytes)
        .read_to_string(&mut out)
        .map_err(|e| format!("gunzip: {e}"))?;
    Ok(out)
}

fn numbers(line: &str) -> Result<Vec<f64>, String> {
    line.split(',')
        .map(|f| f.trim().parse::<f64>().map_err(|e| format!("`{f}`: {e}")))
        .collect()
}

fn label(v: f64, classes: u32) -> Result<u32, String> {
    if v.fract() == 0.0 && v >= 0.0 && v < f64::from(classes) {
        Ok(v as u32)
    } else {
        Err(format!("label {v} is not a class in 0..{classes}"))
    }
}

fn split_classification(
    mut rows: Vec<(Vec<f32>, u32)>,
    features: usize,
    classes: usize,
    eval_rows: usize,
    normalize: impl FnOnce(&mut Classification),
) -> Result<Classification, String> {
    if rows.len() <= eval_rows {
        return Err(format!("only {} rows", rows.len()));
    }
    rows.shuffle(&mut stream(0, Purpose::Split, 0));
    let (eval, train) = rows.split_at(eval_rows);
    let mut c = Classification {
        features,
        classes,
        train_x: train.iter().flat_map(|r| r.0.iter().copied()).collect(),
        train_y: train.iter().map(|r| r.1).collect(),
        eval_x: eval.iter().flat_map(|r| r.0.iter().copied()).collect(),
        eval_y: eval.iter().map(|r| r.1).collect(),
    };
    normalize(&mut c);
    Ok(c)
}

/// Scales every feature to zero mean and unit deviation over the training rows (the held-out
/// rows get the same transform, as at inference time).
fn standardize(c: &mut Classification) {
    let f = c.features;
    let n = c.train_y.len() as f64;
    for j in 0..f {
        let col = || c.train_x.iter().skip(j).step_by(f).map(|&v| f64::from(v));
        let mean = col().sum::<f64>() / n;
        let sd = (col().map(|v| (v - mean).powi(2)).sum::<f64>() / n)
            .sqrt()
            .max(1e-12);
        for x in [&mut c.train_x, &mut c.eval_x] {
            for v in x.iter_mut().skip(j).step_by(f) {
                *v = ((f64::from(*v) - mean) / sd) as f32;
            }
        }
    }
}

fn interpolate(series: &[Option<f64>]) -> Result<Vec<f64>, String> {
    let known: Vec<(usize, f64)> = series
        .iter()
        .enumerate()
        .filter_map(|(i, v)| v.map(|v| (i, v)))
        .collect();
    let (&(first, first_v), &(last, last_v)) = (
        known.first().ok_or("no values")?,
        known.last().ok_or("no values")?,
    );
    let mut out = vec![0.0; series.len()];
    out[..=first].fill(first_v);
    out[last..].fill(last_v);
    for pair in known.windows(2) {
        let ((i0, v0), (i1, v1)) = (pair[0], pair[1]);
        for (i, slot) in out.iter_mut().enumerate().take(i1 + 1).skip(i0) {
            *slot = v0 + (v1 - v0) * (i - i0) as f64 / (i1 - i0) as f64;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digits_parse_into_the_documented_split() {
        let d = digits().unwrap();
        assert_eq!(d.train_y.len() + d.eval_y.len(), 1797);
        assert_eq!(d.eval_y.len(), DIGITS_EVAL_ROWS);
        assert_eq!(d.train_x.len(), d.train_y.len() * 64);
        assert!(d.train_x.iter().all(|&p| (0.0..=1.0).contains(&p)));
    }

    #[test]
    fn wine_is_standardized_on_training_rows() {
        let w = wine().unwrap();
        assert_eq!(w.train_y.len() + w.eval_y.len(), 178);
        let col0: Vec<f32> = w.train_x.iter().step_by(13).copied().collect();
        let mean = col0.iter().sum::<f32>() / col0.len() as f32;
        assert!(mean.abs() < 1e-4, "mean {mean}");
    }

    #[test]
    fn co2_has_no_gaps_and_holds_out_the_latest_weeks() {
        let c = co2().unwrap();
        assert!(c.train_x.iter().chain(&c.eval_x).all(|v| v.is_finite()));
        assert_eq!(c.train_x.len(), c.train_y.len() * CO2_WINDOW);
        let total = c.train_y.len() + c.eval_y.len();
        assert_eq!(total, 2284 - CO2_WINDOW);
    }

    #[test]
    fn interpolation_fills_gaps_linearly() {
        let s = interpolate(&[Some(1.0), None, None, Some(4.0), None]).unwrap();
        assert_eq!(s, vec![1.0, 2.0, 3.0, 4.0, 4.0]);
    }
}
