//! The RAPIDS RMM log reader: no input panics, wraps, or reads without bound; what it
//! reads validates without panicking; and the streamed reader (what `allocsim replay`
//! uses) agrees with the whole-log reader: where it reads a log to its end without
//! giving up, the whole-log reader reads it too, to the same events but for their ids.
#![no_main]
use libfuzzer_sys::fuzz_target;
use workloads::csv::EventStream;
use workloads::Event;

/// An event without its id (the streamed reader gives freed pointers' ids again).
fn shape(e: &Event) -> (u8, u64, u64) {
    match *e {
        Event::Alloc {
            size_bytes, stream, ..
        } => (0, size_bytes, stream),
        Event::Free { .. } => (1, 0, 0),
        _ => (2, 0, 0),
    }
}

fuzz_target!(|data: &[u8]| {
    let path = std::path::Path::new("fuzz.log");
    let whole = workloads::rmm::read_rmm_from(data, path);
    if let Ok(trace) = &whole {
        assert_eq!(trace.events.len(), trace.times_us.len());
        let _ = workloads::validate(trace);
    }
    let mut streamed = workloads::rmm::RmmEvents::new(data, path);
    let events: Vec<Event> = streamed.by_ref().collect();
    if streamed.stopped().is_none() {
        let trace = whole.expect("a log read to its end streamed reads whole");
        let a: Vec<_> = events.iter().map(shape).collect();
        let b: Vec<_> = trace.events.iter().map(shape).collect();
        assert_eq!(a, b);
    }
});
