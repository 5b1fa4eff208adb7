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
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
