//! Why the environment was rejected.

/// Why the environment was rejected. Each names the variable at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A required variable is not set.
    #[error("{name} is required but not set")]
    Missing {
        /// The variable.
        name: &'static str,
    },
    /// A variable's value does not parse.
    #[error("{name}={value:?} is invalid: {reason}")]
    Invalid {
        /// The variable.
        name: &'static str,
        /// The value, shortened if long.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
}

impl ConfigError {
    /// `name` set to `value`, which does not parse for `reason`; a long
    /// value is shortened to its first 200 characters.
    pub fn invalid(name: &'static str, value: &str, reason: impl Into<String>) -> Self {
        const MAX: usize = 200;
        let value = match value.char_indices().nth(MAX) {
            Some((cut, _)) => format!("{}…", &value[..cut]),
            None => value.to_owned(),
        };
        ConfigError::Invalid {
            name,
            value,
            reason: reason.into(),
        }
    }

    /// The variable at fault.
    pub fn variable(&self) -> &'static str {
        match self {
            ConfigError::Missing { name } | ConfigError::Invalid { name, .. } => name,
        }
    }
}
