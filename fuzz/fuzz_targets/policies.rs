//! The `--policies` list parser: no input panics; what parses prints and parses back to
//! the same configuration, and builds or says why not.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    let defaults = Default::default();
    if let Ok(specs) = policies::spec::parse_policy_list(text, &defaults) {
        for spec in specs {
            let printed = spec.config.to_string();
            let again = policies::spec::parse_policy(&printed, &defaults)
                .unwrap_or_else(|e| panic!("{printed:?} does not parse back: {e}"));
            assert_eq!(again.config, spec.config, "{printed:?}");
            let _ = spec.config.build();
        }
    }
});
