//! Current Knative's `OBSERVABILITY_CONFIG` (JSON), read through the whole
//! environment contract; when it is accepted, its request-log template is
//! parsed too.

#![no_main]

use libfuzzer_sys::fuzz_target;
use qproxy::Config;
use qproxy::config::Generation;
use qproxy_fuzz::defaults;

fuzz_target!(|data: &[u8]| {
    let Ok(json) = std::str::from_utf8(data) else {
        return;
    };
    let mut vars = defaults(Generation::Current);
    vars.set("OBSERVABILITY_CONFIG", json);
    match Config::from_vars(&vars) {
        Ok(config) => {
            if !json.is_empty() {
                assert_eq!(config.observability.generation(), Generation::Current);
            }
            let _ = config.observability.request_log().template();
        }
        Err(e) => {
            assert!(e.to_string().contains(e.variable()));
            assert!(!e.to_string().contains('\n'));
        }
    }
});
