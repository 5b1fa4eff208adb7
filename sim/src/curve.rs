//! Where training curves come from: the metric a job reports as a function of how much of its
//! work is done.
//!
//! [`Curve`] is the plug: [`Parametric`] curves (exponential or power-law decay toward a floor)
//! are what the experiments use today; [`TableCurve`] interpolates measured points, and
//! [`Catalog::load_curve_table`] reads the trainer's calibration curve table
//! (`converge-trainer calibrate`) into the catalog (the binary's `--curves FILE`). Seeded noise is added by the engine, not here,
//! so curves stay pure functions.
//!
//! The catalog's models stand in for the papers' workloads (FlowCon Table 1, SpeCon Table II).
//! Their work, parallelism and curve shapes are set by eye from the papers' descriptions (e.g.
//! VAE reaches most of its gain early; GRU reaches 96.8% of its maximum in 14.5% of its time,
//! flowcon-tcc2022-extended.txt:83; LSTM-CFC uses ~19% of a worker alone,
//! flowcon-icpp2019.txt:857) — they are a model, not measurements.

use converge_policy::growth::Direction;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// A training curve: metric value at a fraction of the job's work done (0..=1).
pub trait Curve: std::fmt::Debug + Send + Sync {
    /// The metric at `fraction` of the work done.
    fn value(&self, fraction: f64) -> f64;
    /// Whether lower or higher is better.
    fn direction(&self) -> Direction;
}

/// A parametric curve from `initial` toward `floor`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Parametric {
    /// Value at the start.
    pub initial: f64,
    /// Value approached at the end.
    pub floor: f64,
    /// The decay shape.
    pub shape: Shape,
}

/// The decay of a [`Parametric`] curve over the fraction `x` of work done.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Shape {
    /// `exp(-rate · x)`.
    Exponential {
        /// Decay rate per unit of work fraction.
        rate: f64,
    },
    /// `(1 + scale · x)^(-exponent)`.
    PowerLaw {
        /// Time scale.
        scale: f64,
        /// Exponent.
        exponent: f64,
    },
}

impl Parametric {
    /// An exponential curve from a calibration row: the metric goes from `initial` to `last`
    /// and has made 90% of that improvement at `fraction_at_90` of the run (the trainer's
    /// `calibrate` table reports exactly these columns). `exp(-rate · f90) = 0.1` gives the rate;
    /// the floor is set so that the curve ends at `last`.
    pub fn from_calibration(initial: f64, last: f64, fraction_at_90: f64) -> Self {
        let f90 = fraction_at_90.clamp(1e-3, 1.0);
        let rate = std::f64::consts::LN_10 / f90;
        let tail = (-rate).exp();
        // last = floor + (initial - floor)·tail  =>  floor = (last - initial·tail) / (1 - tail).
        let floor = (last - initial * tail) / (1.0 - tail);
        Parametric {
            initial,
            floor,
            shape: Shape::Exponential { rate },
        }
    }
}

impl Curve for Parametric {
    fn value(&self, fraction: f64) -> f64 {
        let x = fraction.clamp(0.0, 1.0);
        let decay = match self.shape {
            Shape::Exponential { rate } => (-rate * x).exp(),
            Shape::PowerLaw { scale, exponent } => (1.0 + scale * x).powf(-exponent),
        };
        self.floor + (self.initial - self.floor) * decay
    }

    fn direction(&self) -> Direction {
        if self.floor <= self.initial {
            Direction::Minimize
        } else {
            Direction::Maximize
        }
    }
}

/// A curve interpolated linearly between measured `(fraction, value)` points.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TableCurve {
    /// Points sorted by fraction.
    pub points: Vec<(f64, f64)>,
    /// The metric's direction.
    pub direction: Direction,
}

impl TableCurve {
    /// A curve through measured points sorted by fraction; its direction is the one the
    /// points go (a metric that ends no higher than it starts is minimised).
    pub fn measured(points: Vec<(f64, f64)>) -> Self {
        let direction = if points.last().map(|p| p.1) <= points.first().map(|p| p.1) {
            Direction::Minimize
        } else {
            Direction::Maximize
        };
        TableCurve { points, direction }
    }
}

impl Curve for TableCurve {
    fn value(&self, fraction: f64) -> f64 {
        let p = &self.points;
        match p.iter().position(|&(x, _)| x >= fraction) {
            None => p.last().map_or(0.0, |&(_, v)| v),
            Some(0) => p[0].1,
            Some(i) => {
                let (x0, y0) = p[i - 1];
                let (x1, y1) = p[i];
                if x1 > x0 {
                    y0 + (y1 - y0) * (fraction - x0) / (x1 - x0)
                } else {
                    y1
                }
            }
        }
    }

    fn direction(&self) -> Direction {
        self.direction
    }
}

/// A training workload: how much work it is, how many cores it can use, and its curve.
#[derive(Debug)]
pub struct Model {
    /// Name used in experiment files.
    pub name: String,
    /// Work to finish, in core-seconds of the reference worker (calibration 1.0).
    pub work: f64,
    /// The most cores it can use at once.
    pub max_cores: f64,
    /// Its metric over the fraction of work done.
    pub curve: Box<dyn Curve>,
}

/// The measured cost of sharing a worker, for jobs that carry no measurement of their own
/// (the papers' models). Default: no cost (a work-conserving CPU).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Contention {
    /// The factors.
    pub sharing: crate::measured::Sharing,
    /// Where the factors come from, for reports.
    pub source: String,
}

/// The models an experiment may name.
#[derive(Debug)]
pub struct Catalog {
    models: Vec<Model>,
    contention: Contention,
}

impl Catalog {
    /// The built-in parametric stand-ins for the papers' workloads.
    pub fn builtin() -> Self {
        let exp = |initial: f64, floor: f64, rate: f64| -> Box<dyn Curve> {
            Box::new(Parametric {
                initial,
                floor,
                shape: Shape::Exponential { rate },
            })
        };
        let pow = |initial: f64, floor: f64, scale: f64, exponent: f64| -> Box<dyn Curve> {
            Box::new(Parametric {
                initial,
                floor,
                shape: Shape::PowerLaw { scale, exponent },
            })
        };
        let m = |name: &str, work: f64, max_cores: f64, curve| Model {
            name: name.into(),
            work,
            max_cores,
            curve,
        };
        Catalog {
            contention: Contention::default(),
            models: vec![
                // VAE: long, converges early (most of its gain in the first fifth).
                m("vae", 860.0, 3.0, exp(550.0, 100.0, 7.0)),
                // MNIST: short, fast learners.
                m("mnist-pytorch", 420.0, 4.0, exp(2.3, 0.05, 6.0)),
                m("mnist-tensorflow", 115.0, 4.0, exp(2.3, 0.06, 5.0)),
                // LSTM-CFC: cannot use much of a worker.
                m("lstm-cfc", 300.0, 0.8, pow(1.2, 0.1, 20.0, 1.2)),
                m("lstm-crf", 700.0, 2.5, pow(40.0, 2.0, 15.0, 1.0)),
                m("bi-rnn", 600.0, 3.0, exp(2.3, 0.1, 20.0)),
                m("gru", 650.0, 2.6, exp(1.0, 0.05, 24.0)),
                m("rnn", 500.0, 3.0, exp(2.3, 0.2, 10.0)),
                m("dynamic-rnn", 550.0, 3.0, pow(2.3, 0.2, 25.0, 0.9)),
            ],
        }
    }

    /// A catalog with no models (a trace builds one model per job).
    pub fn empty() -> Self {
        Catalog {
            models: Vec::new(),
            contention: Contention::default(),
        }
    }

    /// The cost of sharing a worker that every model of this catalog pays.
    pub fn contention(&self) -> &Contention {
        &self.contention
    }

    /// Sets the cost of sharing a worker (e.g. [`crate::measured::Measured::contention`]).
    pub fn set_contention(&mut self, contention: Contention) {
        self.contention = contention;
    }

    /// Adds (or replaces) a model, e.g. one built from a calibration table.
    pub fn insert(&mut self, model: Model) {
        self.models.retain(|m| m.name != model.name);
        self.models.push(model);
    }

    /// Loads the trainer's calibration curve table (`converge-trainer calibrate`, the markdown
    /// table `| model | 0% | 1% | ... | 100% |` of held-out loss at fractions of each run) and
    /// gives every model named there that curve. A model the catalog already has keeps its work
    /// and parallelism; a new one gets `new_work` reference core-seconds and one core (the
    /// calibration runs one thread per model). Returns the names loaded. Cells reading `n/a`
    /// are skipped.
    pub fn load_curve_table(&mut self, text: &str, new_work: f64) -> Result<Vec<String>> {
        let bad = |why: String| Error::Invalid(format!("calibration curve table: {why}"));
        let rows: Vec<Vec<&str>> = text
            .lines()
            .map(str::trim)
            .filter(|l| l.starts_with('|'))
            .map(|l| l.trim_matches('|').split('|').map(str::trim).collect())
            .collect();
        let header = rows
            .iter()
            .find(|r| r.first().is_some_and(|c| *c == "model"))
            .ok_or_else(|| bad("no header row starting with `| model |`".into()))?;
        let fractions: Vec<f64> = header[1..]
            .iter()
            .map(|c| {
                c.trim_end_matches('%')
                    .parse::<f64>()
                    .map(|p| p / 100.0)
                    .map_err(|_| bad(format!("header cell {c:?} is not a percentage")))
            })
            .collect::<Result<_>>()?;
        let mut loaded = Vec::new();
        for row in rows.iter().filter(|r| {
            r.first()
                .is_some_and(|c| *c != "model" && !c.starts_with("---"))
        }) {
            let name = row[0].to_string();
            let points: Vec<(f64, f64)> = row[1..]
                .iter()
                .zip(&fractions)
                .filter_map(|(cell, &f)| cell.parse::<f64>().ok().map(|v| (f, v)))
                .collect();
            if points.len() < 2 {
                return Err(bad(format!(
                    "model {name:?} has fewer than two numeric points"
                )));
            }
            let curve = Box::new(TableCurve::measured(points));
            match self.models.iter_mut().find(|m| m.name == name) {
                Some(m) => m.curve = curve,
                None => self.models.push(Model {
                    name: name.clone(),
                    work: new_work,
                    max_cores: 1.0,
                    curve,
                }),
            }
            loaded.push(name);
        }
        Ok(loaded)
    }

    /// The model's index by name.
    pub fn index(&self, name: &str) -> Result<usize> {
        self.models
            .iter()
            .position(|m| m.name == name)
            .ok_or_else(|| Error::UnknownModel {
                name: name.into(),
                known: self.names().join(", "),
            })
    }

    /// The model at `index`.
    pub fn get(&self, index: usize) -> &Model {
        &self.models[index]
    }

    /// Every model's name.
    pub fn names(&self) -> Vec<&str> {
        self.models.iter().map(|m| m.name.as_str()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parametric_curves_start_at_initial_and_approach_floor() {
        let c = Parametric {
            initial: 2.0,
            floor: 0.5,
            shape: Shape::Exponential { rate: 5.0 },
        };
        assert_eq!(c.value(0.0), 2.0);
        assert!((c.value(1.0) - (0.5 + 1.5 * (-5.0f64).exp())).abs() < 1e-12);
        assert_eq!(c.direction(), Direction::Minimize);
        let p = Parametric {
            initial: 0.1,
            floor: 0.9,
            shape: Shape::PowerLaw {
                scale: 3.0,
                exponent: 1.0,
            },
        };
        assert_eq!(p.direction(), Direction::Maximize);
        assert!((p.value(1.0) - (0.9 - 0.8 / 4.0)).abs() < 1e-12);
    }

    #[test]
    fn calibration_rows_become_curves_through_their_points() {
        // Loss 2.5 -> 0.1, 90% of the gain made at 20% of the run.
        let c = Parametric::from_calibration(2.5, 0.1, 0.2);
        assert!((c.value(0.0) - 2.5).abs() < 1e-12);
        assert!((c.value(1.0) - 0.1).abs() < 1e-12);
        let gained = (2.5 - c.value(0.2)) / (2.5 - 0.1);
        assert!((gained - 0.9).abs() < 0.01, "{gained}");
    }

    #[test]
    fn trainer_curve_table_loads_into_the_catalog() {
        let text = "| model | 0% | 10% | 50% | 100% |\n|---|---:|---:|---:|---:|\n\
                    | vae | 550.0 | 300.0 | 150.0 | 120.0 |\n\
                    | mlp-digits | 2.30 | 0.90 | n/a | 0.20 |\n";
        let mut c = Catalog::builtin();
        let work = c.get(c.index("vae").unwrap()).work;
        let names = c.load_curve_table(text, 300.0).unwrap();
        assert_eq!(names, vec!["vae", "mlp-digits"]);
        let vae = c.get(c.index("vae").unwrap());
        assert_eq!(vae.work, work, "known models keep their work");
        assert!((vae.curve.value(0.3) - 225.0).abs() < 1e-9);
        let mlp = c.get(c.index("mlp-digits").unwrap());
        assert_eq!((mlp.work, mlp.max_cores), (300.0, 1.0));
        // n/a skipped: 0.9 + (0.2 - 0.9) · (0.55 - 0.1) / (1.0 - 0.1) = 0.55.
        assert!((mlp.curve.value(0.55) - 0.55).abs() < 1e-9);
        assert!(c.load_curve_table("| x | y |", 1.0).is_err());
    }

    #[test]
    fn table_curve_interpolates() {
        let t = TableCurve {
            points: vec![(0.0, 2.0), (0.5, 1.0), (1.0, 0.5)],
            direction: Direction::Minimize,
        };
        assert_eq!(t.value(0.25), 1.5);
        assert_eq!(t.value(2.0), 0.5);
        assert_eq!(t.value(-1.0), 2.0);
    }

    #[test]
    fn unknown_model_lists_the_known_ones() {
        let e = Catalog::builtin().index("resnet").unwrap_err().to_string();
        assert!(e.contains("resnet") && e.contains("vae"));
    }
}
