//! The pickle machine's entry lane against its general path, on snapshots written as
//! Python's pickler writes them (protocol 4, every string memoized, shared ones
//! referred back to), with entries of every shape the lane must hand over.

use std::collections::HashMap;
use std::path::Path;

use super::pickle::without_lane;
use super::{read_snapshot_pickle_from, read_snapshot_pickle_from_with, SnapshotOptions};
use crate::recorded::RecordedRun;
use crate::ReadError;

/// A value of an entry's item.
#[derive(Clone)]
enum V {
    Int(i128),
    /// A string, shared (memoized once, then referred to) or written anew.
    Str(String, bool),
    None,
    Bool(bool),
    Float(f64),
    /// A pool id tuple, shared through the memo.
    Pool(u64, u64),
    /// A list of two ints, written anew.
    PoolList(u64, u64),
    /// `{'k': 'v'}`, written anew.
    Dict,
    /// A reference to the entry's own dict.
    SelfRef,
    /// A memo reference that was never stored.
    Missing,
    /// A string memoized by BINPUT rather than MEMOIZE.
    Binput(String),
    /// A FRAME opcode, then the value.
    Framed(Box<V>),
    /// Stack frames: frame dicts by number, each written the first time and referred
    /// back to after, as PyTorch shares them; a list of one is written with APPEND.
    Frames(Vec<u32>),
    /// A dict of one item (SETITEM) in a list, under a key not kept.
    OneItem,
    /// Stack frames the entry lane does not read itself (frames kept), by number:
    /// 0, a new frame dict with its keys in another order; 1, one with a key more;
    /// 2, the previous entry's frames list by memo reference (shared); 3, an empty
    /// tuple (as this crate's writer gives an entry without frames); 4, a frame that
    /// is a string (an error); 5, a frame with a negative line (an error).
    OddFrames(u8),
    /// An empty tuple (as this crate's writer gives `frames` without frames),
    /// memoized or not (Python's pickler never memoizes one).
    EmptyTuple(bool),
}

/// A key: a string (shared), or an int.
#[derive(Clone)]
enum K {
    S(&'static str),
    Int(i64),
}

/// A pickler that memoizes as Python's does.
struct Py {
    out: Vec<u8>,
    memo: u32,
    shared: HashMap<String, u32>,
    pools: HashMap<(u64, u64), u32>,
    frames: HashMap<u32, u32>,
    /// Memo slot of the last frames list written.
    last_frames: Option<u32>,
    /// Odd frames written (each a new frame dict).
    odd_frames: u32,
}

impl Py {
    fn new() -> Py {
        Py {
            out: vec![0x80, 4],
            memo: 0,
            shared: HashMap::new(),
            pools: HashMap::new(),
            frames: HashMap::new(),
            last_frames: None,
            odd_frames: 0,
        }
    }

    fn memoize(&mut self) -> u32 {
        self.out.push(0x94);
        self.memo += 1;
        self.memo - 1
    }

    fn get(&mut self, key: u32) {
        if key < 256 {
            self.out.extend([b'h', key as u8]);
        } else {
            self.out.push(b'j');
            self.out.extend(key.to_le_bytes());
        }
    }

    fn raw_str(&mut self, s: &str) {
        if s.len() < 256 {
            self.out.extend([0x8c, s.len() as u8]);
        } else {
            self.out.push(b'X');
            self.out.extend((s.len() as u32).to_le_bytes());
        }
        self.out.extend(s.as_bytes());
    }

    fn str(&mut self, s: &str, shared: bool) {
        if shared {
            if let Some(&k) = self.shared.get(s) {
                return self.get(k);
            }
        }
        self.raw_str(s);
        let k = self.memoize();
        if shared {
            self.shared.insert(s.to_string(), k);
        }
    }

    fn int(&mut self, v: i128) {
        if (0..256).contains(&v) {
            self.out.extend([b'K', v as u8]);
        } else if (0..65536).contains(&v) {
            self.out.push(b'M');
            self.out.extend((v as u16).to_le_bytes());
        } else if i32::try_from(v).is_ok() {
            self.out.push(b'J');
            self.out.extend((v as i32).to_le_bytes());
        } else {
            // LONG1, minimal two's complement.
            let mut le = v.to_le_bytes().to_vec();
            while le.len() > 1 {
                let (last, prev) = (le[le.len() - 1], le[le.len() - 2]);
                if (last == 0 && prev & 0x80 == 0) || (last == 0xff && prev & 0x80 != 0) {
                    le.pop();
                } else {
                    break;
                }
            }
            self.out.extend([0x8a, le.len() as u8]);
            self.out.extend(le);
        }
    }

    fn value(&mut self, v: &V, own: u32) {
        match v {
            V::Int(i) => self.int(*i),
            V::Str(s, shared) => self.str(s, *shared),
            V::None => self.out.push(b'N'),
            V::Bool(b) => self.out.push(if *b { 0x88 } else { 0x89 }),
            V::Float(f) => {
                self.out.push(b'G');
                self.out.extend(f.to_be_bytes());
            }
            V::Pool(a, b) => match self.pools.get(&(*a, *b)) {
                Some(&k) => self.get(k),
                None => {
                    self.int(i128::from(*a));
                    self.int(i128::from(*b));
                    self.out.push(0x86);
                    let k = self.memoize();
                    self.pools.insert((*a, *b), k);
                }
            },
            V::PoolList(a, b) => {
                self.out.push(b']');
                self.memoize();
                self.out.push(b'(');
                self.int(i128::from(*a));
                self.int(i128::from(*b));
                self.out.push(b'e');
            }
            V::Dict => {
                self.out.push(b'}');
                self.memoize();
                self.str("k", true);
                self.str("v", true);
                self.out.push(b's');
            }
            V::SelfRef => self.get(own),
            V::Missing => self.get(0x00ff_ffff),
            V::Binput(s) => {
                self.raw_str(s);
                self.out.extend([b'r']);
                self.out.extend(self.memo.to_le_bytes());
                self.memo += 1;
            }
            V::EmptyTuple(memoized) => {
                self.out.push(b')');
                if *memoized {
                    self.memoize();
                }
            }
            V::OddFrames(kind) => {
                let kind = *kind;
                if kind == 2 {
                    match self.last_frames {
                        Some(k) => return self.get(k),
                        None => return self.value(&V::Frames(vec![1, 2]), own),
                    }
                }
                if kind == 3 {
                    return self.out.push(b')');
                }
                self.out.push(b']');
                self.last_frames = Some(self.memoize());
                self.out.push(b'(');
                self.frame(3);
                self.odd_frames += 1;
                let f = self.odd_frames;
                let file = format!("odd_{f}.py");
                match kind {
                    4 => self.str(&file, true),
                    _ => {
                        self.out.push(b'}');
                        self.memoize();
                        self.out.push(b'(');
                        let line = if kind == 5 { -3 } else { i128::from(f) };
                        let mut items = vec![
                            ("filename", V::Str(file, false)),
                            ("line", V::Int(line)),
                            ("name", V::Str(format!("odd_{f}"), true)),
                        ];
                        if kind == 0 {
                            items.reverse();
                        }
                        if kind == 1 {
                            items.insert(1, ("fx_node_op", V::Str("call".into(), true)));
                        }
                        for (k, v) in &items {
                            self.str(k, true);
                            self.value(v, own);
                        }
                        self.out.push(b'u');
                    }
                }
                self.out.push(b'e');
            }
            V::Frames(ids) => {
                self.out.push(b']');
                self.last_frames = Some(self.memoize());
                if ids.len() != 1 {
                    self.out.push(b'(');
                }
                for &f in ids {
                    self.frame(f);
                }
                self.out.push(if ids.len() == 1 { b'a' } else { b'e' });
            }
            V::OneItem => {
                self.out.push(b']');
                self.memoize();
                self.out.push(b'}');
                self.memoize();
                self.str("k", true);
                self.int(1);
                self.out.extend([b's', b'a']);
            }
            V::Framed(v) => {
                self.out.push(0x95);
                self.out.extend(0u64.to_le_bytes());
                self.value(v, own);
            }
        }
    }

    /// Frame dict `f`: written the first time, referred back to after.
    fn frame(&mut self, f: u32) {
        match self.frames.get(&f) {
            Some(&k) => self.get(k),
            None => {
                self.out.push(b'}');
                let k = self.memoize();
                self.out.push(b'(');
                self.str("filename", true);
                let file = format!("/usr/lib/python3/site-packages/pkg/module_{f}.py");
                self.str(&file, true);
                self.str("line", true);
                self.int(i128::from(f % 3000));
                self.str("name", true);
                self.str(&format!("function_{f}"), true);
                self.out.push(b'u');
                self.frames.insert(f, k);
            }
        }
    }

    /// An entry dict: `}` MEMOIZE (or BINPUT when `binput`) MARK items SETITEMS.
    fn entry(&mut self, items: &[(K, V)], binput: bool) {
        self.out.push(b'}');
        let own = if binput {
            self.out.push(b'r');
            self.out.extend(self.memo.to_le_bytes());
            self.memo += 1;
            self.memo - 1
        } else {
            self.memoize()
        };
        self.out.push(b'(');
        for (k, v) in items {
            match k {
                K::S(s) => self.str(s, true),
                K::Int(i) => self.int(i128::from(*i)),
            }
            self.value(v, own);
        }
        self.out.push(b'u');
    }

    /// A snapshot of one device trace of `entries` and no segments.
    fn snapshot(entries: &[(Vec<(K, V)>, bool)]) -> Vec<u8> {
        let mut p = Py::new();
        p.out.push(b'}');
        p.memoize();
        p.out.push(b'(');
        p.str("segments", true);
        p.out.push(b']');
        p.memoize();
        p.str("device_traces", true);
        p.out.push(b']');
        p.memoize();
        p.out.push(b']');
        p.memoize();
        p.out.push(b'(');
        for (n, (items, binput)) in entries.iter().enumerate() {
            if n > 0 && n % 1000 == 0 {
                p.out.extend(b"e(");
            }
            p.entry(items, *binput);
        }
        p.out.extend(b"ea");
        p.out.extend(b"u.");
        p.out
    }
}

/// xorshift, for entries drawn the same way on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The usual items of an entry, as PyTorch 2.11 writes them (2.15 adds a pool id).
fn plain(action: &'static str, addr: i128, size: i128) -> Vec<(K, V)> {
    vec![
        (K::S("action"), V::Str(action.into(), true)),
        (K::S("addr"), V::Int(addr)),
        (K::S("size"), V::Int(size)),
        (K::S("stream"), V::Int(0)),
        (K::S("time_us"), V::Int(1_795_391_990_920_542)),
        (K::S("compile_context"), V::Str("N/A".into(), false)),
        (K::S("user_metadata"), V::Str(String::new(), true)),
    ]
}

/// One odd item (or shape) for an entry, drawn by `pick`.
fn oddity(items: &mut Vec<(K, V)>, pick: u64, rng: &mut Rng) {
    let big = (1i128 << 63) + i128::from(rng.below(1 << 20));
    match pick {
        0 => items.push((K::S("pool_id"), V::Pool(0, 0))),
        1 => items.push((K::S("pool_id"), V::Pool(1, rng.below(3)))),
        2 => items.push((K::S("pool_id"), V::None)),
        3 => items.push((K::S("pool_id"), V::PoolList(1, 2))),
        4 => items.push((K::S("size"), V::Int(i128::from(rng.below(1 << 40))))),
        5 => items.push((K::S("stream"), V::Int(-1))),
        6 => items.push((K::S("stream"), V::Int(big))),
        7 => items.push((K::S("addr"), V::Int(big))),
        8 => items.push((K::S("ratio"), V::Float(0.5))),
        9 => items.push((K::S("flag"), V::Bool(true))),
        10 => items.push((K::S("user_metadata"), V::Dict)),
        11 => items.push((K::S("compile_context"), V::Str("x".repeat(40), false))),
        12 => items.push((K::Int(7), V::Int(1))),
        13 => items.push((K::S("other"), V::SelfRef)),
        14 => items.push((K::S("other"), V::Binput("y".into()))),
        15 => items.push((K::S("time_us"), V::Framed(Box::new(V::Int(5))))),
        16 => items.push((K::S("time_us"), V::None)),
        17 => items.push((K::S("other"), V::None)),
        18 => items.insert(0, (K::S("frames"), V::Str("z".into(), true))),
        19 => items.reverse(),
        20 => items.push((K::S("frames"), V::Frames(vec![rng.below(50) as u32]))),
        21 => items.push((K::S("forward_frames"), V::OneItem)),
        22 => items.push((K::S("frames"), V::Frames(Vec::new()))),
        23 => items.push((K::S("internal_metadata"), V::Str("m".into(), true))),
        // A string memoized inside stack frames (not kept), read back as an action.
        24 => items.push((
            K::S("action"),
            V::Str(format!("function_{}", rng.below(40)), true),
        )),
        25..=28 => items.push((K::S("frames"), V::OddFrames((pick - 25) as u8))),
        29 => items.push((K::S("frames"), V::Frames(vec![rng.below(50) as u32; 2]))),
        30 => items.push((K::S("frames"), V::EmptyTuple(true))),
        31 => items.push((K::S("other"), V::EmptyTuple(false))),
        32 => items.push((K::S("frames"), V::EmptyTuple(false))),
        _ => items.push((K::S("stream"), V::Int(i128::from(rng.below(1 << 62))))),
    }
}

/// An entry that is an error (the general machine names it and what is wrong).
fn error(items: &mut Vec<(K, V)>, pick: u64) {
    match pick {
        0 => items.push((K::S("size"), V::Int(-7))),
        1 => items.push((K::S("addr"), V::Bool(false))),
        2 => items.push((K::S("action"), V::Int(3))),
        3 => items.push((K::S("addr"), V::None)),
        4 => items.push((K::S("size"), V::Missing)),
        5 => items.push((K::S("pool_id"), V::Str("p".into(), true))),
        6 => items.push((K::S("stream"), V::SelfRef)),
        7 => items.push((K::S("size"), V::Int(1i128 << 70))),
        // Errors only when frames are kept.
        9 => items.push((K::S("frames"), V::OddFrames(4))),
        10 => items.push((K::S("frames"), V::OddFrames(5))),
        _ => items.retain(|(k, _)| !matches!(k, K::S("stream"))),
    }
}

/// `n` entries allocating and freeing, one in `odd` with an oddity (references to the
/// entry's own dict only if `self_refs`), plus `annotate`, `oom`, `snapshot` and
/// segment entries; each with stack frames if `frames`.
fn entries(
    seed: u64,
    n: usize,
    odd: u64,
    self_refs: bool,
    frames: bool,
) -> Vec<(Vec<(K, V)>, bool)> {
    let mut rng = Rng(seed);
    (0..n)
        .map(|i| {
            let addr = 0x7f00_0000_0000 + (i as i128 / 2) * 512;
            let mut items = match rng.below(40) {
                0 => {
                    let mut e = plain("annotate", addr, 0);
                    e.push((K::S("user_metadata"), V::Str("step".into(), false)));
                    e
                }
                1 => {
                    let mut e = plain("oom", 0, 1 << 30);
                    e.retain(|(k, _)| !matches!(k, K::S("addr")));
                    e.push((K::S("device_free"), V::Int(1 << 20)));
                    e
                }
                2 => plain("snapshot", 0, 0),
                3 => plain("segment_alloc", addr, 2 << 20),
                _ if i % 2 == 0 => plain("alloc", addr, 512),
                _ => plain("free_completed", addr, 512),
            };
            if frames {
                let depth = 1 + rng.below(30);
                let stack = (0..depth)
                    .map(|l| (l * 40 + rng.below(40)) as u32)
                    .collect();
                let at = rng.below(items.len() as u64 + 1) as usize;
                items.insert(at, (K::S("frames"), V::Frames(stack)));
            }
            if rng.below(odd) == 0 {
                let pick = match rng.below(33) {
                    // In the first batch (before the list is known to hold entries)
                    // a dict inside itself is refused.
                    13 if !self_refs || i < 1000 => 0,
                    pick => pick,
                };
                oddity(&mut items, pick, &mut rng);
            }
            (items, rng.below(50) == 0)
        })
        .collect()
}

fn read(bytes: &[u8]) -> Result<RecordedRun, ReadError> {
    read_snapshot_pickle_from(bytes, Path::new("lane.pickle"), 0)
}

/// As [`read`], keeping the stack frames.
fn read_kept(bytes: &[u8]) -> Result<RecordedRun, ReadError> {
    let keep = SnapshotOptions { keep_frames: true };
    read_snapshot_pickle_from_with(bytes, Path::new("lane.pickle"), 0, &keep)
}

/// Entries of every shape read the same through the entry lane as through the
/// general machine (the lane off), frames kept or not, and the same without frames as
/// with them kept; the lane did read the plain ones, and their stacks when kept.
#[test]
fn lane_reads_every_shape_as_the_general_machine() {
    let shapes = [(1, 4), (2, 2), (3, 1), (4, 1_000_000)];
    for (seed, odd, frames) in shapes
        .map(|(s, o)| (s, o, false))
        .into_iter()
        .chain(shapes.map(|(s, o)| (s + 10, o, true)))
    {
        let bytes = Py::snapshot(&entries(seed, 5000, odd, true, frames));
        let lane = read(&bytes).unwrap();
        let general = without_lane(|| read(&bytes)).unwrap();
        assert_eq!(lane, general, "seed {seed}");
        // With the frames kept, a dict inside itself is refused: none here.
        let bytes = Py::snapshot(&entries(seed, 5000, odd, false, frames));
        let lane = read(&bytes).unwrap();
        let keep = SnapshotOptions { keep_frames: true };
        let kept =
            read_snapshot_pickle_from_with(&bytes[..], Path::new("lane.pickle"), 0, &keep).unwrap();
        let mut info = kept.snapshot.clone().unwrap();
        info.frames = None;
        assert_eq!(lane.entries, kept.entries, "seed {seed}");
        assert_eq!(lane.snapshot.as_ref(), Some(&info), "seed {seed}");
        assert_eq!(lane.times_us, kept.times_us, "seed {seed}");
        assert_eq!(lane.calls, kept.calls, "seed {seed}");
        // Frames kept, the lane reads them as the general machine does: the same
        // frames, stacks and stack of each entry.
        let general = without_lane(|| read_kept(&bytes)).unwrap();
        assert_eq!(kept, general, "seed {seed}");
        if frames {
            let f = kept.snapshot.as_ref().unwrap().frames.as_ref().unwrap();
            assert!(f.entries.len() > 4000, "seed {seed}: {}", f.entries.len());
        }
    }
    // Without oddities, all but the first batch of 1000 (read before the list is
    // known to hold entries) and the annotations go through the lane.
    for frames in [false, true] {
        let plain = entries(4, 5000, 1_000_000, true, frames);
        // Annotations, stacks of one frame memoized before (`] h a`: the lane takes
        // the reference for the next key) and the last entry (too near the end of the
        // input for the lane's lookahead) go to the general machine.
        let general = plain[1000..]
            .iter()
            .filter(|(items, _)| {
                items.iter().any(|(_, v)| match v {
                    V::Str(a, _) => a == "annotate",
                    V::Frames(stack) => stack.len() == 1,
                    _ => false,
                })
            })
            .count() as u64;
        let bytes = Py::snapshot(&plain);
        let by_lane = super::tests::lane_entries(&bytes);
        assert!(by_lane >= 4000 - general - 1, "{by_lane} {general}");
        assert!(general < 400, "{general}");
        // Frames kept, the lane reads the stacks too (those of one frame included):
        // only the annotations go to the general machine.
        let annotations = plain[1000..]
            .iter()
            .filter(|(items, _)| {
                items
                    .iter()
                    .any(|(_, v)| matches!(v, V::Str(a, _) if a == "annotate"))
            })
            .count() as u64;
        let by_lane = super::tests::lane_entries_with(&bytes, true);
        assert!(by_lane >= 4000 - annotations - 1, "{by_lane} {annotations}");
    }
}

/// An entry that is an error gives the same message (naming the entry, or the byte
/// for a broken pickle) with the lane as without, wherever it is, frames kept or not
/// (a frame that is no frame dict is an error only when they are kept).
#[test]
fn lane_errors_are_the_general_machines() {
    let mut rng = Rng(9);
    for pick in 0..11 {
        for _ in 0..3 {
            let mut all = entries(pick + 20, 2500, 3, true, pick % 2 == 0);
            let at = 1000 + rng.below(1500) as usize;
            let mut bad = plain("alloc", 0x1000, 512);
            error(&mut bad, pick);
            all[at].0 = bad;
            let bytes = Py::snapshot(&all);
            // Frames kept, the same (and the frames' errors: they are errors only then).
            let kept = read_kept(&bytes);
            let kept_general = without_lane(|| read_kept(&bytes));
            assert_eq!(
                kept, kept_general,
                "error {pick} at entry {at}, frames kept"
            );
            let kept = kept.unwrap_err().to_string();
            if pick >= 9 {
                assert!(read(&bytes).is_ok(), "error {pick}");
                assert!(
                    kept.contains(&format!("entry {at}: 'frames' [1]")),
                    "{kept}"
                );
                continue;
            }
            let lane = read(&bytes).unwrap_err().to_string();
            let general = without_lane(|| read(&bytes)).unwrap_err().to_string();
            assert_eq!(lane, general, "error {pick} at entry {at}");
            assert_eq!(lane, kept, "error {pick} at entry {at}");
            if pick != 4 {
                assert!(lane.contains(&format!("entry {at}:")), "{lane}");
            }
        }
    }
}

/// A snapshot this crate writes (`export`: `frames: ()` for entries without stack
/// frames) reads through the entry lane, frames kept or not, as the general machine
/// reads it (`()` memoized or under other keys: the oddities above).
#[test]
fn exports_read_through_the_lane() {
    use super::write::{snapshot_bytes, SnapshotEncoding, SnapshotEntry, SnapshotOut};
    use crate::recorded::Action;
    let entries: Vec<SnapshotEntry> = (0..3000u64)
        .map(|i| SnapshotEntry {
            action: if i % 2 == 0 {
                Action::Alloc
            } else {
                Action::FreeCompleted
            },
            addr: 0x7f00_0000_0000 + (i / 2) * 512,
            size: 512,
            stream: 0,
            time_us: (i % 3 == 0).then_some(1_700_000_000_000_000 + i),
            stack: None,
        })
        .collect();
    let bytes = snapshot_bytes(
        &SnapshotOut {
            entries,
            ..SnapshotOut::default()
        },
        SnapshotEncoding::Pickle,
    );
    assert_eq!(
        read(&bytes).unwrap(),
        without_lane(|| read(&bytes)).unwrap()
    );
    assert_eq!(
        read_kept(&bytes).unwrap(),
        without_lane(|| read_kept(&bytes)).unwrap()
    );
    // All but the first batch of 1000 (read before the list is known to hold entries)
    // and the last (too near the end of the input for the lane's lookahead).
    assert!(super::tests::lane_entries(&bytes) >= 1999);
    assert!(super::tests::lane_entries_with(&bytes, true) >= 1999);
}
