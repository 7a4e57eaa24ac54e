//! Reading typed values out of the process environment.
//!
//! Knative's queue-proxy parses its environment with `envconfig`, which
//! treats a variable that is *set but empty* differently from one that is
//! *unset*: an unset optional variable keeps its zero value, while a set one
//! must parse (an empty integer or boolean is an error). [`Vars`] keeps that
//! distinction so qproxy accepts exactly the environments Knative produces and
//! rejects, with a message naming the variable, the ones it would choke on.

use std::collections::HashMap;
use std::time::Duration;

use super::error::ConfigError;

/// A snapshot of the environment variables qproxy reads.
#[derive(Debug, Clone, Default)]
pub struct Vars {
    values: HashMap<String, Value>,
}

/// One variable's value as the process environment held it.
#[derive(Debug, Clone)]
enum Value {
    Text(String),
    /// Not valid UTF-8; kept (lossily decoded) so the error can show it.
    NotUtf8(String),
}

impl Vars {
    /// Takes a snapshot of the process environment.
    ///
    /// A variable whose value is not valid UTF-8 is kept so that reading it
    /// (and only reading it) fails with its name.
    pub fn from_process() -> Self {
        let values = std::env::vars_os()
            .filter_map(|(k, v)| {
                let k = k.into_string().ok()?;
                let v = v.into_string().map_or_else(
                    |v| Value::NotUtf8(v.to_string_lossy().into_owned()),
                    Value::Text,
                );
                Some((k, v))
            })
            .collect();
        Self { values }
    }

    /// Builds a set of variables from `(name, value)` pairs.
    pub fn from_pairs<I, K, V>(pairs: I) -> Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        Self {
            values: pairs
                .into_iter()
                .map(|(k, v)| (k.into(), Value::Text(v.into())))
                .collect(),
        }
    }

    /// Sets (or replaces) one variable.
    pub fn set(&mut self, name: impl Into<String>, value: impl Into<String>) {
        self.values.insert(name.into(), Value::Text(value.into()));
    }

    /// Removes one variable.
    pub fn remove(&mut self, name: &str) {
        self.values.remove(name);
    }

    /// The variables whose values are text, as `(name, value)`.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.values.iter().filter_map(|(k, v)| match v {
            Value::Text(t) => Some((k.as_str(), t.as_str())),
            Value::NotUtf8(_) => None,
        })
    }

    /// The raw value of `name`, if it is set (possibly empty).
    pub fn raw(&self, name: &'static str) -> Result<Option<&str>, ConfigError> {
        match self.values.get(name) {
            None => Ok(None),
            Some(Value::Text(v)) => Ok(Some(v.as_str())),
            Some(Value::NotUtf8(v)) => Err(ConfigError::invalid(name, v, "not valid UTF-8")),
        }
    }

    /// A variable that must be present; it may be empty.
    pub fn required(&self, name: &'static str) -> Result<&str, ConfigError> {
        self.raw(name)?.ok_or(ConfigError::Missing { name })
    }

    /// A string that is "not set" when absent or empty.
    pub fn non_empty(&self, name: &'static str) -> Result<Option<&str>, ConfigError> {
        Ok(self.raw(name)?.filter(|v| !v.is_empty()))
    }

    /// An optional boolean: absent is `false`; present must parse.
    pub fn bool(&self, name: &'static str) -> Result<bool, ConfigError> {
        match self.raw(name)? {
            None => Ok(false),
            Some(v) => parse_bool(v).ok_or_else(|| {
                ConfigError::invalid(name, v, "not a boolean (expected true or false)")
            }),
        }
    }

    /// A required port number.
    pub fn required_port(&self, name: &'static str) -> Result<u16, ConfigError> {
        parse_port(name, self.required(name)?)
    }

    /// An optional port number with a default when absent.
    pub fn port_or(&self, name: &'static str, default: u16) -> Result<u16, ConfigError> {
        match self.raw(name)? {
            None => Ok(default),
            Some(v) => parse_port(name, v),
        }
    }

    /// A required non-negative integer.
    pub fn required_count(&self, name: &'static str) -> Result<u32, ConfigError> {
        parse_count(name, self.required(name)?)
    }

    /// An optional non-negative integer: absent is `0`.
    pub fn count(&self, name: &'static str) -> Result<u32, ConfigError> {
        match self.raw(name)? {
            None => Ok(0),
            Some(v) => parse_count(name, v),
        }
    }

    /// An optional duration in whole seconds where absent or `0` means unset.
    pub fn seconds(&self, name: &'static str) -> Result<Option<Duration>, ConfigError> {
        let secs = self.count(name)?;
        Ok((secs > 0).then(|| Duration::from_secs(secs.into())))
    }

    /// An optional duration in whole seconds, `default` when absent; `0` is
    /// zero.
    pub fn seconds_or(&self, name: &'static str, default: u64) -> Result<Duration, ConfigError> {
        match self.raw(name)? {
            None => Ok(Duration::from_secs(default)),
            Some(v) => Ok(Duration::from_secs(parse_count(name, v)?.into())),
        }
    }

    /// An optional floating point number: absent is `0.0`.
    pub fn float(&self, name: &'static str) -> Result<f64, ConfigError> {
        match self.raw(name)? {
            None => Ok(0.0),
            Some(v) => v
                .parse::<f64>()
                .map_err(|_| ConfigError::invalid(name, v, "not a number")),
        }
    }
}

/// Parses a boolean exactly as Go's `strconv.ParseBool` does.
fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

fn parse_port(name: &'static str, v: &str) -> Result<u16, ConfigError> {
    v.parse::<u16>()
        .map_err(|_| ConfigError::invalid(name, v, "not a port number (0-65535)"))
}

fn parse_count(name: &'static str, v: &str) -> Result<u32, ConfigError> {
    match v.parse::<i64>() {
        Ok(n) if n < 0 => Err(ConfigError::invalid(name, v, "must not be negative")),
        Ok(n) => u32::try_from(n).map_err(|_| ConfigError::invalid(name, v, "is too large")),
        Err(_) => Err(ConfigError::invalid(name, v, "not an integer")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Vars {
        Vars::from_pairs(pairs.iter().copied())
    }

    #[test]
    fn booleans_follow_go_strconv() {
        for t in ["1", "t", "T", "TRUE", "true", "True"] {
            assert_eq!(parse_bool(t), Some(true), "{t}");
        }
        for f in ["0", "f", "F", "FALSE", "false", "False"] {
            assert_eq!(parse_bool(f), Some(false), "{f}");
        }
        for bad in ["", "yes", "tRUE", " true", "2"] {
            assert_eq!(parse_bool(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn absent_optional_values_take_their_zero() {
        let v = vars(&[]);
        assert!(!v.bool("X").unwrap());
        assert_eq!(v.count("X").unwrap(), 0);
        assert_eq!(v.seconds("X").unwrap(), None);
        assert_eq!(v.float("X").unwrap(), 0.0);
        assert_eq!(v.non_empty("X").unwrap(), None);
        assert_eq!(v.port_or("X", 9090).unwrap(), 9090);
    }

    #[test]
    fn set_but_empty_numbers_and_booleans_are_errors() {
        let v = vars(&[("X", "")]);
        assert!(v.bool("X").is_err());
        assert!(v.count("X").is_err());
        assert!(v.seconds("X").is_err());
        assert!(v.float("X").is_err());
        assert!(v.port_or("X", 1).is_err());
        assert_eq!(v.non_empty("X").unwrap(), None);
        assert_eq!(v.required("X").unwrap(), "");
    }

    #[test]
    fn counts_reject_negative_and_garbage() {
        assert_eq!(vars(&[("X", "42")]).count("X").unwrap(), 42);
        assert_eq!(vars(&[("X", "+7")]).count("X").unwrap(), 7);
        let err = vars(&[("X", "-1")]).count("X").unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"X="-1" is invalid: must not be negative"#
        );
        let err = vars(&[("X", "ten")]).count("X").unwrap_err();
        assert_eq!(err.to_string(), r#"X="ten" is invalid: not an integer"#);
        assert!(vars(&[("X", "99999999999")]).count("X").is_err());
    }

    #[test]
    fn seconds_zero_means_unset() {
        assert_eq!(vars(&[("X", "0")]).seconds("X").unwrap(), None);
        assert_eq!(
            vars(&[("X", "12")]).seconds("X").unwrap(),
            Some(Duration::from_secs(12))
        );
    }

    #[test]
    fn ports_are_bounded() {
        assert_eq!(vars(&[("P", "8012")]).required_port("P").unwrap(), 8012);
        assert!(vars(&[("P", "65536")]).required_port("P").is_err());
        assert!(vars(&[("P", "http")]).required_port("P").is_err());
        assert!(vars(&[("P", "-1")]).required_port("P").is_err());
        let err = vars(&[]).required_port("P").unwrap_err();
        assert_eq!(err.to_string(), "P is required but not set");
    }

    #[test]
    fn floats_parse() {
        assert_eq!(vars(&[("F", "0.25")]).float("F").unwrap(), 0.25);
        assert_eq!(vars(&[("F", "1e-05")]).float("F").unwrap(), 1e-05);
        assert!(vars(&[("F", "a quarter")]).float("F").is_err());
    }

    #[test]
    fn non_utf8_values_are_errors_naming_the_variable() {
        let mut v = vars(&[]);
        v.values.insert("X".into(), Value::NotUtf8("abc".into()));
        let err = v.required("X").unwrap_err();
        assert_eq!(err.to_string(), r#"X="abc" is invalid: not valid UTF-8"#);
    }
}
