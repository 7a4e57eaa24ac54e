//! The readiness probe Knative passes in `SERVING_READINESS_PROBE`, one
//! probe or (with `ENABLE_MULTI_CONTAINER_PROBES`, the first byte's lowest
//! bit) a list, read through the whole environment contract.

#![no_main]

use libfuzzer_sys::fuzz_target;
use qproxy::Config;
use qproxy::config::Generation;
use qproxy_fuzz::defaults;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let Ok(json) = std::str::from_utf8(rest) else {
        return;
    };
    let mut vars = defaults(Generation::Classic);
    vars.set("SERVING_READINESS_PROBE", json);
    let multi = selector & 1 == 1;
    if multi {
        vars.set("ENABLE_MULTI_CONTAINER_PROBES", "true");
    }
    match Config::from_vars(&vars) {
        Ok(config) => {
            // One probe, unless a list (which may be empty) was asked for.
            if !multi && !json.trim().is_empty() {
                assert!(
                    !config.readiness_probes.is_empty(),
                    "{json:?} gave no probe"
                );
            }
        }
        Err(e) => {
            assert_eq!(e.variable(), "SERVING_READINESS_PROBE");
            assert!(!e.to_string().contains('\n'));
        }
    }
});
