//! The crate's error type.

/// Errors from building a policy with invalid parameters.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// A parameter is outside its valid range.
    #[error("invalid parameter {name} = {value}: {expected}")]
    InvalidParameter {
        /// The parameter's name.
        name: &'static str,
        /// The value given.
        value: f64,
        /// What a valid value looks like.
        expected: &'static str,
    },
    /// A value curve breaks the submit-time rule (value-based-allocation.txt:65, Fig. 1).
    #[error(
        "invalid value curve (max_value {max_value}, full_value_until_s {full_value_until_s}, \
         zero_value_at_s {zero_value_at_s}): needs max_value > 0 and \
         0 <= full_value_until_s <= zero_value_at_s, all finite"
    )]
    InvalidValueCurve {
        /// The curve's maximum value.
        max_value: f64,
        /// Seconds of full value after release.
        full_value_until_s: f64,
        /// Seconds after release at which the value is 0.
        zero_value_at_s: f64,
    },
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
