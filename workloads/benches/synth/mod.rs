//! A large, realistic snapshot pickle for benchmarks, made from the real ones in
//! `tests/data/oracle/h100-torch2.11-pickles`: their traces repeated with each
//! repetition's addresses moved to a fresh range (so the final segments still account
//! for the trace), written as Python's pickler writes a PyTorch 2.11 snapshot
//! (protocol 4, memo, batches of 1000), with stack frames: every entry has its own
//! list of ~24 frames drawn from a few thousand frame dicts shared through the memo,
//! as `py_symbolize` produces them.

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use workloads::{Action, RecordedRun};

/// The real snapshots the synthetic one is made of.
pub fn sources() -> Vec<RecordedRun> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/data/oracle/h100-torch2.11-pickles");
    ["gpt_train_small", "random_stress", "multistream"]
        .iter()
        .map(|n| {
            workloads::read_snapshot_pickle(&dir.join(format!("{n}.pickle")), 0)
                .unwrap_or_else(|e| panic!("{e}"))
        })
        .collect()
}

/// Protocol 4 writer with Python's memo behaviour for strings.
struct Pickler<W: Write> {
    out: W,
    memo: u32,
    strings: HashMap<String, u32>,
    written: u64,
}

impl<W: Write> Pickler<W> {
    fn bytes(&mut self, b: &[u8]) -> io::Result<()> {
        self.written += b.len() as u64;
        self.out.write_all(b)
    }

    fn memoize(&mut self) -> io::Result<u32> {
        self.bytes(&[0x94])?;
        self.memo += 1;
        Ok(self.memo - 1)
    }

    fn get(&mut self, key: u32) -> io::Result<()> {
        if key < 256 {
            self.bytes(&[b'h', key as u8])
        } else {
            let mut b = vec![b'j'];
            b.extend(key.to_le_bytes());
            self.bytes(&b)
        }
    }

    /// A string, memoized the first time (`shared`) or every time (a new object).
    fn str(&mut self, s: &str, shared: bool) -> io::Result<()> {
        if shared {
            if let Some(&k) = self.strings.get(s) {
                return self.get(k);
            }
        }
        let mut b = if s.len() < 256 {
            vec![0x8c, s.len() as u8]
        } else {
            let mut b = vec![b'X'];
            b.extend((s.len() as u32).to_le_bytes());
            b
        };
        b.extend(s.as_bytes());
        self.bytes(&b)?;
        let k = self.memoize()?;
        if shared {
            self.strings.insert(s.to_string(), k);
        }
        Ok(())
    }

    fn int(&mut self, v: i64) -> io::Result<()> {
        if (0..256).contains(&v) {
            self.bytes(&[b'K', v as u8])
        } else if (0..65536).contains(&v) {
            let mut b = vec![b'M'];
            b.extend((v as u16).to_le_bytes());
            self.bytes(&b)
        } else if i32::try_from(v).is_ok() {
            let mut b = vec![b'J'];
            b.extend((v as i32).to_le_bytes());
            self.bytes(&b)
        } else {
            // LONG1, minimal two's complement as Python encodes it.
            let mut le = v.to_le_bytes().to_vec();
            while le.len() > 1 {
                let last = le[le.len() - 1];
                let prev = le[le.len() - 2];
                if (last == 0 && prev & 0x80 == 0) || (last == 0xff && prev & 0x80 != 0) {
                    le.pop();
                } else {
                    break;
                }
            }
            if v > 0 && le[le.len() - 1] & 0x80 != 0 {
                le.push(0);
            }
            let mut b = vec![0x8a, le.len() as u8];
            b.extend(le);
            self.bytes(&b)
        }
    }

    fn uint(&mut self, v: u64) -> io::Result<()> {
        match i64::try_from(v) {
            Ok(i) => self.int(i),
            Err(_) => {
                let mut b = vec![0x8a, 9];
                b.extend(v.to_le_bytes());
                b.push(0);
                self.bytes(&b)
            }
        }
    }
}

/// Writes a synthetic snapshot of about `target` bytes to `path`, with stack frames
/// or without (`frames`, as with `_record_memory_history(context=None)`); returns the
/// bytes written and the number of trace entries.
pub fn write_snapshot(path: &Path, target: u64, frames: bool) -> io::Result<(u64, u64)> {
    let runs = sources();
    let file = std::fs::File::create(path)?;
    let mut p = Pickler {
        out: io::BufWriter::with_capacity(1 << 20, file),
        memo: 0,
        strings: HashMap::new(),
        written: 0,
    };
    // Each run's entries cost about 230 bytes with frames.
    let entry_bytes = if frames { 230 } else { 75 };
    let per_rep: u64 = runs
        .iter()
        .map(|r| r.entries.len() as u64 * entry_bytes)
        .sum();
    let reps = (target / per_rep).max(1);
    let offset = |rep: u64| (rep + 1) << 40;

    p.bytes(&[0x80, 4])?;
    p.bytes(b"}")?;
    p.memoize()?;
    p.bytes(b"(")?;
    // Segments: every repetition's final segments.
    p.str("segments", true)?;
    p.bytes(b"]")?;
    p.memoize()?;
    let empty_frames;
    {
        let mut n = 0;
        p.bytes(b"(")?;
        let mut first = true;
        let mut ef = 0;
        for rep in 0..reps {
            for run in &runs {
                for s in &run.segments {
                    if n == 1000 {
                        p.bytes(b"e(")?;
                        n = 0;
                    }
                    n += 1;
                    let base = s.address + offset(rep);
                    p.bytes(b"}")?;
                    p.memoize()?;
                    p.bytes(b"(")?;
                    for (k, v) in [
                        ("device", 0),
                        ("address", base),
                        ("total_size", s.total_size),
                        ("allocated_size", s.allocated_size),
                        ("active_size", s.allocated_size),
                        ("requested_size", 0),
                        ("stream", s.stream),
                    ] {
                        p.str(k, true)?;
                        p.uint(v)?;
                    }
                    p.str("segment_type", true)?;
                    p.str(&s.segment_type, true)?;
                    p.str("segment_pool_id", true)?;
                    p.bytes(&[b'K', 0, b'K', 0, 0x86])?;
                    p.memoize()?;
                    p.str("is_expandable", true)?;
                    p.bytes(&[if s.is_expandable { 0x88 } else { 0x89 }])?;
                    p.str("frames", true)?;
                    if first {
                        p.bytes(b"]")?;
                        ef = p.memoize()?;
                        first = false;
                    } else {
                        p.get(ef)?;
                    }
                    p.str("blocks", true)?;
                    p.bytes(b"]")?;
                    p.memoize()?;
                    p.bytes(b"(")?;
                    for b in &s.blocks {
                        p.bytes(b"}")?;
                        p.memoize()?;
                        p.bytes(b"(")?;
                        p.str("address", true)?;
                        p.uint(b.address + offset(rep))?;
                        p.str("size", true)?;
                        p.uint(b.size)?;
                        p.str("requested_size", true)?;
                        p.uint(b.requested_size.unwrap_or(b.size))?;
                        p.str("state", true)?;
                        p.str(b.state.name(), true)?;
                        p.str("frames", true)?;
                        p.get(ef)?;
                        p.bytes(b"u")?;
                    }
                    p.bytes(b"eu")?;
                }
            }
        }
        p.bytes(b"e")?;
        empty_frames = ef;
    }
    // The trace.
    p.str("device_traces", true)?;
    p.bytes(b"]")?;
    p.memoize()?;
    p.bytes(b"]")?;
    p.memoize()?;
    p.bytes(b"(")?;
    let mut n = 0;
    let mut count = 0u64;
    let mut frame_dicts: Vec<u32> = Vec::new();
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut time = 1_795_391_990_920_542u64;
    for rep in 0..reps {
        for run in &runs {
            for e in run
                .entries
                .iter()
                .filter(|e| e.action != Action::EmptyCache)
            {
                if n == 1000 {
                    p.bytes(b"e(")?;
                    n = 0;
                }
                n += 1;
                count += 1;
                time += 7;
                p.bytes(b"}")?;
                p.memoize()?;
                p.bytes(b"(")?;
                p.str("action", true)?;
                p.str(e.action.name(), true)?;
                if e.action == Action::Oom {
                    p.str("device_free", true)?;
                    p.uint(1 << 20)?;
                } else {
                    p.str("addr", true)?;
                    p.uint(if e.addr == 0 { 0 } else { e.addr + offset(rep) })?;
                }
                p.str("size", true)?;
                p.uint(e.size)?;
                p.str("stream", true)?;
                p.uint(e.stream)?;
                p.str("time_us", true)?;
                p.uint(time)?;
                p.str("compile_context", true)?;
                p.str("N/A", false)?;
                p.str("user_metadata", true)?;
                p.str("", true)?;
                p.str("frames", true)?;
                if !frames {
                    p.get(empty_frames)?;
                    p.bytes(b"u")?;
                    continue;
                }
                p.bytes(b"]")?;
                p.memoize()?;
                p.bytes(b"(")?;
                let depth = 16 + next() % 16;
                for level in 0..depth {
                    // Deep frames are few and shared; leaf frames vary more.
                    let pool = 64 + level * 96;
                    let pick = (next() % pool) as usize + (level as usize) * 4096;
                    while frame_dicts.len() <= pick {
                        frame_dicts.push(u32::MAX);
                    }
                    if frame_dicts[pick] == u32::MAX {
                        p.bytes(b"}")?;
                        let k = p.memoize()?;
                        p.bytes(b"(")?;
                        p.str("filename", true)?;
                        p.str(
                            &format!(
                                "/usr/lib/python3/site-packages/pkg{}/module_{}.py",
                                level,
                                pick % 97
                            ),
                            true,
                        )?;
                        p.str("line", true)?;
                        p.int((pick % 3000) as i64 + 1)?;
                        p.str("name", true)?;
                        p.str(&format!("function_{pick}"), true)?;
                        p.bytes(b"u")?;
                        frame_dicts[pick] = k;
                    } else {
                        p.get(frame_dicts[pick])?;
                    }
                }
                p.bytes(b"eu")?;
            }
        }
    }
    p.bytes(b"ea")?; // the device's trace into device_traces
    p.str("allocator_settings", true)?;
    p.bytes(b"}")?;
    p.memoize()?;
    p.str("PYTORCH_CUDA_ALLOC_CONF", true)?;
    p.str("", true)?;
    p.bytes(b"s")?;
    p.str("external_annotations", true)?;
    p.bytes(b"]")?;
    p.memoize()?;
    p.bytes(b"u.")?;
    p.out.flush()?;
    Ok((p.written, count))
}
