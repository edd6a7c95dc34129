//! What the structured generators share: fresh ids, the events of one phase (a training
//! step, a served batch) queued for the iterator, and scratch allocations whose
//! lifetimes, in events, are drawn.

use std::collections::{BTreeSet, VecDeque};

use rand_chacha::ChaCha8Rng;

use super::dist::Dist;
use super::MAX_GENERATED_BYTES;
use crate::trace::{AllocId, Event};

/// Short-lived allocations a program makes besides its tensors of record (kernels'
/// workspaces, small results, views materialized): at each layer's pass, a burst of
/// `count` allocations of `bytes` each, each freed as the `lifetime`-th alloc/free
/// event after its own (later by one for each other free that falls due at the same
/// event; at the end of the phase at the latest).
#[derive(Clone, Debug, PartialEq)]
pub struct Scratch {
    /// How many per burst.
    pub count: Dist,
    /// Bytes of each (at least 1).
    pub bytes: Dist,
    /// Lifetime, in alloc/free events.
    pub lifetime: Dist,
}

/// A structured generator as phases: a setup, [`Phases::phase_count`] repeated phases
/// (training steps, served batches), an end, each queuing its events on the emitter.
/// [`Phases::next_event`] is their iterator's `next`: the one loop that hands out the
/// queued events and runs the next phase when the queue is empty.
pub(crate) trait Phases {
    /// The generator's queue.
    fn emitter(&mut self) -> &mut Emitter;
    /// The repeated phases.
    fn phase_count(&self) -> u64;
    /// What comes before the first phase (parameters, weights).
    fn setup(&mut self);
    /// Phase `k` (from 0).
    fn phase(&mut self, k: u64);
    /// What comes after the last phase (the frees at the end).
    fn finish(&mut self);

    /// The next event, running phases until one is queued; `None` after the end.
    fn next_event(&mut self) -> Option<Event> {
        loop {
            if let Some(e) = self.emitter().queue.pop_front() {
                return Some(e);
            }
            let n = self.phase_count();
            match self.emitter().phase {
                0 => self.setup(),
                p if p <= n => self.phase(p - 1),
                p if p == n + 1 => self.finish(),
                _ => return None,
            }
            self.emitter().phase += 1;
        }
    }
}

/// The event queue of a structured generator.
pub(crate) struct Emitter {
    pub queue: VecDeque<Event>,
    /// 0: setup not done; 1..=phases: that many phases done or queued; then the end.
    phase: u64,
    next_id: u64,
    /// Alloc and free events emitted so far.
    count: u64,
    /// Scratch allocations: (death, id), the next to die first.
    scratch: BTreeSet<(u64, u64)>,
}

impl Emitter {
    pub fn new() -> Emitter {
        Emitter {
            queue: VecDeque::new(),
            phase: 0,
            next_id: 0,
            count: 0,
            scratch: BTreeSet::new(),
        }
    }

    /// Allocates `bytes` (clamped to `1..=MAX_GENERATED_BYTES`) on `stream`.
    pub fn alloc(&mut self, bytes: u64, stream: u64) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.queue.push_back(Event::Alloc {
            id: AllocId(id),
            size_bytes: bytes.clamp(1, MAX_GENERATED_BYTES),
            stream,
        });
        self.tick();
        id
    }

    /// Frees `id`.
    pub fn free(&mut self, id: u64) {
        self.queue.push_back(Event::Free { id: AllocId(id) });
        self.tick();
    }

    /// A mark.
    pub fn mark(&mut self, label: String) {
        self.queue.push_back(Event::Mark { label });
    }

    /// One alloc or free was emitted: the scratch allocations whose time has come die.
    fn tick(&mut self) {
        self.count += 1;
        self.flush();
    }

    /// Frees the scratch allocations due: `death` is the count of events after which
    /// the free comes.
    fn flush(&mut self) {
        while let Some(&(death, id)) = self.scratch.first() {
            if death > self.count {
                break;
            }
            self.scratch.remove(&(death, id));
            self.queue.push_back(Event::Free { id: AllocId(id) });
            self.count += 1;
        }
    }

    /// A burst of scratch allocations on `stream`: count, then each one's size and
    /// lifetime, drawn in that order.
    pub fn scratch_burst(&mut self, scratch: Option<&Scratch>, rng: &mut ChaCha8Rng, stream: u64) {
        let Some(s) = scratch else { return };
        let n = s.count.sample(rng);
        for _ in 0..n {
            let bytes = s.bytes.sample(rng);
            let life = s.lifetime.sample(rng).max(1);
            // The alloc is event `count + 1`; its free is event `count + 1 + life`,
            // which comes after event `count + life`.
            let death = self.count.saturating_add(life);
            let id = self.alloc(bytes, stream);
            self.scratch.insert((death, id));
            self.flush();
        }
    }

    /// Frees the scratch allocations still live, in id order (the end of a phase).
    pub fn drain_scratch(&mut self) {
        let mut ids: Vec<u64> = std::mem::take(&mut self.scratch)
            .into_iter()
            .map(|(_, id)| id)
            .collect();
        ids.sort_unstable();
        for id in ids {
            self.free(id);
        }
    }
}

/// `a × b × c` bytes, saturating (the emitter clamps to the largest generated size).
pub(crate) fn bytes(a: u64, b: u64, c: u64) -> u64 {
    a.saturating_mul(b).saturating_mul(c)
}
