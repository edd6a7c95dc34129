//! `PYTORCH_CUDA_ALLOC_CONF` as PyTorch parses it: no input panics; what parses prints
//! and parses back to the same configuration.
#![no_main]
use libfuzzer_sys::fuzz_target;
use policies::caching::CachingConfig;

fuzz_target!(|text: &str| {
    if let Ok(config) = CachingConfig::from_alloc_conf(text) {
        let printed = config.to_alloc_conf();
        let again = CachingConfig::from_alloc_conf(&printed)
            .unwrap_or_else(|e| panic!("{printed:?} does not parse back: {e}"));
        assert_eq!(again, config, "{printed:?}");
    }
});
