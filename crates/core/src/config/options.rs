//! qproxy's own options: what it can do beyond Knative's queue-proxy, each
//! off unless asked for.
//!
//! An option is asked for per revision by an annotation on the Knative
//! Service's template, in the form Knative's queue-proxy extensions use:
//!
//! ```yaml
//! metadata:
//!   annotations:
//!     qpoption.knative.dev/qproxy-upgrades-outlive-timeouts: "on"
//! ```
//!
//! Knative mounts the pod's annotations for the queue-proxy (the Downward
//! API, at `/etc/podinfo/annotations`) when `config-features`'
//! `queueproxy.mount-podinfo` is `enabled`, or `allowed` and the revision
//! carries `features.knative.dev/queueproxy-podinfo: enabled`. The file
//! holds one `key="value"` line per annotation, the value quoted as Go
//! quotes a string. `qpextension.knative.dev/` (the prefix's older
//! spelling) is read too.
//!
//! Cluster-wide defaults come from the image's environment:
//! `QPROXY_OPTION_UPGRADES_OUTLIVE_TIMEOUTS=on`, and so on, one variable per option.
//! An annotation overrides the default either way.
//!
//! Values are `on`/`off`, `true`/`false`, `enabled`/`disabled` or
//! `enable`/`disable`, in any case. A bad value in the environment stops
//! the start (one line naming the variable); a bad annotation, or one
//! naming no option, is one warning and leaves the default in place: a
//! revision's annotation is never a reason not to serve.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use super::error::ConfigError;
use super::vars::Vars;

/// The annotation prefixes an option is read under.
pub const ANNOTATION_PREFIXES: [&str; 2] = ["qpoption.knative.dev/", "qpextension.knative.dev/"];
/// What follows the prefix in every option's annotation.
const OWN: &str = "qproxy-";

/// One of qproxy's options.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Opt {
    /// An upgraded connection (WebSocket) or a `CONNECT` tunnel outlives
    /// the revision's timeouts; only the drain ends it.
    UpgradesOutliveTimeouts,
    /// The request log's template can read `.Response.QueueWait`.
    RequestLogQueueWait,
    /// A revision without `containerConcurrency` gets a limit found from
    /// the app's latency. Read at start only.
    AdaptiveConcurrency,
    /// Answers carry `Server-Timing`: the wait for a slot and the app's
    /// time.
    ServerTiming,
    /// The bytes of tunnels on plain TCP are copied through qproxy's
    /// memory, not spliced from socket to socket.
    NoSplice,
}

impl Opt {
    /// Every option.
    pub const ALL: [Opt; 5] = [
        Opt::UpgradesOutliveTimeouts,
        Opt::RequestLogQueueWait,
        Opt::AdaptiveConcurrency,
        Opt::ServerTiming,
        Opt::NoSplice,
    ];

    /// The option's name, as its annotation ends (`qproxy-<name>`).
    pub const fn name(self) -> &'static str {
        match self {
            Opt::UpgradesOutliveTimeouts => "upgrades-outlive-timeouts",
            Opt::RequestLogQueueWait => "request-log-queue-wait",
            Opt::AdaptiveConcurrency => "adaptive-concurrency",
            Opt::ServerTiming => "server-timing",
            Opt::NoSplice => "no-splice",
        }
    }

    /// The environment variable of the option's default.
    pub const fn env_var(self) -> &'static str {
        match self {
            Opt::UpgradesOutliveTimeouts => "QPROXY_OPTION_UPGRADES_OUTLIVE_TIMEOUTS",
            Opt::RequestLogQueueWait => "QPROXY_OPTION_REQUEST_LOG_QUEUE_WAIT",
            Opt::AdaptiveConcurrency => "QPROXY_OPTION_ADAPTIVE_CONCURRENCY",
            Opt::ServerTiming => "QPROXY_OPTION_SERVER_TIMING",
            Opt::NoSplice => "QPROXY_OPTION_NO_SPLICE",
        }
    }

    const fn bit(self) -> u8 {
        1 << self as u8
    }

    fn named(name: &str) -> Option<Opt> {
        Opt::ALL.into_iter().find(|o| o.name() == name)
    }
}

/// A set of options: those on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct Options(u8);

impl Options {
    /// No option on.
    pub const NONE: Options = Options(0);

    /// Whether `opt` is on.
    pub const fn has(self, opt: Opt) -> bool {
        self.0 & opt.bit() != 0
    }

    /// Whether no option is on.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// These options, with `opt` on or off.
    #[must_use]
    pub const fn with(self, opt: Opt, on: bool) -> Options {
        if on {
            Options(self.0 | opt.bit())
        } else {
            Options(self.0 & !opt.bit())
        }
    }

    /// The options as a bitset, for keeping in an atomic.
    pub const fn bits(self) -> u8 {
        self.0
    }

    /// The options of a bitset made by [`Options::bits`].
    pub const fn from_bits(bits: u8) -> Options {
        Options(bits & ((1 << Opt::ALL.len()) - 1))
    }

    /// Those on, by name, for logs:
    /// `upgrades-outlive-timeouts,request-log-queue-wait`, or `none`.
    pub fn names(self) -> String {
        let on: Vec<&str> = Opt::ALL
            .into_iter()
            .filter(|o| self.has(*o))
            .map(Opt::name)
            .collect();
        if on.is_empty() {
            "none".to_owned()
        } else {
            on.join(",")
        }
    }

    /// The defaults of the image's environment.
    pub fn from_vars(vars: &Vars) -> Result<Options, ConfigError> {
        let mut options = Options::NONE;
        for opt in Opt::ALL {
            let var = opt.env_var();
            if let Some(value) = vars.non_empty(var)? {
                let on = switch(value).ok_or_else(|| {
                    ConfigError::invalid(var, value, "not on/off, true/false or enabled/disabled")
                })?;
                options = options.with(opt, on);
            }
        }
        Ok(options)
    }

    /// These options (the defaults) with a pod's annotations file applied;
    /// each annotation that cannot be applied is one warning.
    pub fn with_annotations(self, file: &str) -> (Options, Vec<String>) {
        let mut options = self;
        let mut warnings = Vec::new();
        for line in file.lines() {
            let Some((key, quoted)) = line.split_once('=') else {
                continue;
            };
            let Some(name) = ANNOTATION_PREFIXES
                .iter()
                .find_map(|prefix| key.strip_prefix(prefix)?.strip_prefix(OWN))
            else {
                continue;
            };
            let Some(opt) = Opt::named(name) else {
                warnings.push(format!(
                    "annotation {key} names no qproxy option (there are {}); it is ignored",
                    Opt::ALL.map(Opt::name).join(", ")
                ));
                continue;
            };
            match unquote(quoted).and_then(switch) {
                Some(on) => options = options.with(opt, on),
                None => warnings.push(format!(
                    "annotation {key}={quoted} is not on/off, true/false or enabled/disabled; \
                     {} stays {}",
                    opt.name(),
                    if self.has(opt) { "on" } else { "off" }
                )),
            }
        }
        (options, warnings)
    }
}

/// The options in force: the defaults with the pod's annotations applied,
/// changed when the annotations change. A handle: its clones share one set,
/// which the server makes when it starts and hands to every layer that
/// reads it (and to what follows the annotations). Each read is one relaxed
/// atomic load, so a change applies to the requests that reach the reader
/// after it.
#[derive(Debug, Clone, Default)]
pub struct LiveOptions(Arc<AtomicU8>);

impl LiveOptions {
    /// `options` in force, until [`set`](Self::set) changes them.
    pub fn new(options: Options) -> Self {
        Self(Arc::new(AtomicU8::new(options.bits())))
    }

    /// The options in force.
    pub fn get(&self) -> Options {
        Options::from_bits(self.0.load(Ordering::Relaxed))
    }

    /// Whether `opt` is in force.
    pub fn has(&self, opt: Opt) -> bool {
        self.get().has(opt)
    }

    /// Puts `options` in force from now on, for every clone of this handle.
    pub fn set(&self, options: Options) {
        self.0.store(options.bits(), Ordering::Relaxed);
    }
}

/// The value of a Go-quoted string, when it has no escapes: no value an
/// option accepts has a character Go would escape.
fn unquote(quoted: &str) -> Option<&str> {
    let inner = quoted.strip_prefix('"')?.strip_suffix('"')?;
    (!inner.contains(['\\', '"'])).then_some(inner)
}

/// An option's value: on or off.
fn switch(value: &str) -> Option<bool> {
    const ON: [&str; 4] = ["on", "true", "enabled", "enable"];
    const OFF: [&str; 4] = ["off", "false", "disabled", "disable"];
    let value = value.trim();
    if ON.iter().any(|v| value.eq_ignore_ascii_case(v)) {
        Some(true)
    } else if OFF.iter().any(|v| value.eq_ignore_ascii_case(v)) {
        Some(false)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_option_has_its_own_bit_name_and_variable() {
        let mut all = Options::NONE;
        for opt in Opt::ALL {
            assert!(!all.has(opt), "{opt:?} shares a bit");
            all = all.with(opt, true);
            assert_eq!(Opt::named(opt.name()), Some(opt));
            assert_eq!(
                opt.env_var(),
                format!(
                    "QPROXY_OPTION_{}",
                    opt.name().to_ascii_uppercase().replace('-', "_")
                )
            );
        }
        assert_eq!(Options::from_bits(all.bits()), all);
        assert_eq!(Options::from_bits(0xff), all, "unknown bits are dropped");
        assert!(
            !all.with(Opt::RequestLogQueueWait, false)
                .has(Opt::RequestLogQueueWait)
        );
        assert_eq!(Options::NONE.names(), "none");
        assert_eq!(
            Options::NONE
                .with(Opt::RequestLogQueueWait, true)
                .with(Opt::UpgradesOutliveTimeouts, true)
                .names(),
            "upgrades-outlive-timeouts,request-log-queue-wait"
        );
    }

    #[test]
    fn defaults_come_from_the_environment_and_a_bad_one_names_its_variable() {
        let vars = Vars::from_pairs([
            ("QPROXY_OPTION_UPGRADES_OUTLIVE_TIMEOUTS", "On"),
            ("QPROXY_OPTION_REQUEST_LOG_QUEUE_WAIT", ""),
        ]);
        let options = Options::from_vars(&vars).unwrap();
        assert_eq!(
            options,
            Options::NONE.with(Opt::UpgradesOutliveTimeouts, true)
        );
        let off = Vars::from_pairs([("QPROXY_OPTION_REQUEST_LOG_QUEUE_WAIT", "false")]);
        assert_eq!(Options::from_vars(&off).unwrap(), Options::NONE);

        let bad = Vars::from_pairs([("QPROXY_OPTION_UPGRADES_OUTLIVE_TIMEOUTS", "yes please")]);
        let err = Options::from_vars(&bad).unwrap_err();
        assert_eq!(err.variable(), "QPROXY_OPTION_UPGRADES_OUTLIVE_TIMEOUTS");
        assert!(err.to_string().contains("yes please"), "{err}");
    }

    /// A file as the kubelet writes it: sorted keys, Go-quoted values, no
    /// final newline.
    const FILE: &str = "autoscaling.knative.dev/target=\"10\"\n\
        description=\"a=b \\\"quoted\\\"\\nsecond line\"\n\
        features.knative.dev/queueproxy-podinfo=\"enabled\"\n\
        qpextension.knative.dev/qproxy-request-log-queue-wait=\"TRUE\"\n\
        qpoption.knative.dev/qproxy-upgrades-outlive-timeouts=\"Enabled\"\n\
        qpoption.knative.dev/security-guard-activate=\"enable\"";

    #[test]
    fn annotations_turn_options_on_and_others_are_left_alone() {
        let (options, warnings) = Options::NONE.with_annotations(FILE);
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(
            options,
            Options::NONE
                .with(Opt::UpgradesOutliveTimeouts, true)
                .with(Opt::RequestLogQueueWait, true)
        );
    }

    #[test]
    fn an_annotation_turns_a_default_off() {
        let defaults = Options::NONE.with(Opt::RequestLogQueueWait, true);
        let (options, warnings) =
            defaults.with_annotations("qpoption.knative.dev/qproxy-request-log-queue-wait=\"off\"");
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(options, Options::NONE);
    }

    #[test]
    fn a_bad_annotation_is_one_warning_and_keeps_the_default() {
        let defaults = Options::NONE.with(Opt::RequestLogQueueWait, true);
        let file = "qpoption.knative.dev/qproxy-request-log-queue-wait=\"sometimes\"\n\
            qpoption.knative.dev/qproxy-upgrades-outlive-timeouts=\"on\\n\"\n\
            qpextension.knative.dev/qproxy-upgrades-outlive-timeouts=on\n\
            qpoption.knative.dev/qproxy-go-faster=\"on\"\n\
            qpoption.knative.dev/qproxy-request-log-queue-wait\n\
            not a line at all";
        let (options, warnings) = defaults.with_annotations(file);
        assert_eq!(options, defaults);
        assert_eq!(warnings.len(), 4, "{warnings:?}");
        assert!(
            warnings[0].contains("qproxy-request-log-queue-wait=\"sometimes\"")
                && warnings[0].contains("request-log-queue-wait stays on"),
            "{warnings:?}"
        );
        assert!(warnings[1].contains("upgrades-outlive-timeouts stays off"));
        assert!(warnings[2].contains("upgrades-outlive-timeouts stays off"));
        assert!(warnings[3].contains("qproxy-go-faster names no qproxy option"));
    }
}
