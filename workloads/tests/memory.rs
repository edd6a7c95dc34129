//! Memory in proportion to the input: the readers' peak heap use measured by a
//! counting allocator (this test binary's own; one test, so nothing runs beside it).

use std::path::Path;

mod common;
use common::peak_during;

/// A YAML trace is read in memory of the order of its events (a YAML trace used to take
/// about 50 times its file size: a million events, 2 GB), and a file of bad rows or
/// events keeps a few messages and a count, not one message per row (a 15 MB CSV of
/// bad rows used to take 885 MB).
#[test]
fn readers_use_memory_in_proportion_to_the_trace() {
    let n = 200_000u64;
    let mut trace = workloads::Trace::new("big", Vec::new());
    for id in 0..n {
        trace.events.push(workloads::Event::Alloc {
            id: workloads::AllocId(id),
            size_bytes: 1 << 20,
            stream: 0,
        });
        trace.events.push(workloads::Event::Free {
            id: workloads::AllocId(id),
        });
    }
    let mut yaml = Vec::new();
    workloads::write_yaml(&trace, &mut yaml).unwrap();
    let (read, peak) = peak_during(|| workloads::read_yaml_from(&yaml[..], Path::new("big.yaml")));
    assert_eq!(read.unwrap().events.len() as u64, 2 * n);
    // The events themselves take 32 bytes each (about the file's size here); the
    // vector may double once. Anything near the old 50x fails.
    assert!(
        peak < 3 * yaml.len(),
        "YAML: peak {peak} bytes for a {} byte file",
        yaml.len()
    );

    let mut csv = b"op,id,bytes,stream\n".to_vec();
    for i in 0..n {
        csv.extend_from_slice(format!("alloc,{i},lots,0\n").as_bytes());
    }
    let (read, peak) = peak_during(|| workloads::read_csv_from(&csv[..], Path::new("bad.csv")));
    let e = read.unwrap_err();
    assert_eq!(e.count(), n);
    assert_eq!(e.all().count(), workloads::MAX_LISTED_PROBLEMS);
    assert!(
        e.to_string()
            .ends_with(&format!("(and {} more problems in this file)", n - 1)),
        "{e}"
    );
    assert!(
        peak < csv.len() / 10,
        "CSV: peak {peak} bytes for a {} byte file of bad rows",
        csv.len()
    );

    // RMM logs: the same (a Vec of every problem before).
    let mut rmm = format!("{}\n", workloads::rmm::RMM_HEADER).into_bytes();
    for i in 0..n {
        rmm.extend_from_slice(format!("1,10:00:00.{i},allocate,0x{i:x},lots,0\n").as_bytes());
    }
    let (read, peak) =
        peak_during(|| workloads::rmm::read_rmm_from(&rmm[..], Path::new("bad.log")));
    let e = read.unwrap_err();
    assert_eq!(e.count(), n);
    assert_eq!(e.all().count(), workloads::MAX_LISTED_PROBLEMS);
    assert!(
        peak < rmm.len() / 10,
        "RMM: peak {peak} bytes for a {} byte file of bad lines",
        rmm.len()
    );

    let mut bad_yaml = b"events:\n".to_vec();
    for i in 0..n {
        bad_yaml.extend_from_slice(format!("  - {{op: alloc, id: {i}, bytes: lots}}\n").as_bytes());
    }
    let (read, peak) =
        peak_during(|| workloads::read_yaml_from(&bad_yaml[..], Path::new("bad.yaml")));
    assert_eq!(read.unwrap_err().count(), n);
    assert!(
        peak < bad_yaml.len() / 10,
        "YAML: peak {peak} bytes for a {} byte file of bad events",
        bad_yaml.len()
    );
}
