//! The RAPIDS RMM log reader: no input panics, wraps, or reads without bound; what it
//! reads validates without panicking; and the streamed reader (what `allocsim replay`
//! uses) agrees with the whole-log reader: where it reads a log to its end without
//! giving up, the whole-log reader reads it too, to the same events but for their ids.
//! And the fast path that reads a usual line from its bytes agrees with the
//! field-by-field reading: the same log with `\r\n` line ends (no line is usual then)
//! reads to the same trace or the same error.
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
    // (Not where a line is near the longest a line may be: a byte more per line
    // could take it past.)
    let longest = data.split(|&b| b == b'\n').map(<[u8]>::len).max().unwrap_or(0);
    if !data.contains(&b'\r') && (longest as u64) + 2 < workloads::csv::MAX_ROW_BYTES {
        let mut crlf = Vec::with_capacity(data.len() * 2);
        for &b in data {
            if b == b'\n' {
                crlf.push(b'\r');
            }
            crlf.push(b);
        }
        let slow = workloads::rmm::read_rmm_from(&crlf[..], path);
        match (&whole, &slow) {
            (Ok(a), Ok(b)) => {
                assert_eq!(a.events, b.events);
                assert_eq!(a.times_us, b.times_us);
                assert_eq!(a.locations, b.locations);
                assert_eq!(a.id_names, b.id_names);
            }
            (a, b) => assert_eq!(
                a.as_ref().map(|_| ()).map_err(ToString::to_string),
                b.as_ref().map(|_| ()).map_err(ToString::to_string)
            ),
        }
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
