//! A file's events read ahead on a second thread: [`ReadAhead`] runs an
//! [`EventStream`] on a thread of its own and hands its events, in their order, to the
//! thread that replays them, so that reading and replaying overlap on two cores. The
//! events, their numbering, where the reader stopped and its counts are the reader's
//! own: only the thread differs. `replay` reads RMM logs so (their reading costs more
//! than their replay: about twice as fast end to end); a CSV trace's rows are read on
//! the replaying thread, where they reach the engine from the branch that read their op,
//! and a second thread was no faster end to end (docs/performance.md, "Reading ahead on
//! a second thread").
//!
//! Memory stays bounded: the reader fills chunks of [`CHUNK`] events, at most
//! [`IN_FLIGHT`] of them wait at once, and emptied chunks go back to the reader to be
//! filled again (no allocation per chunk after the first few).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::csv::{EventStream, Unstreamable};
use crate::{Event, Trace};

/// Events per chunk: 256 KiB of events, small enough to stay in a core's cache between
/// the reader's writes and the replay's reads, large enough that handing a chunk over
/// costs a fraction of an instruction per event.
pub const CHUNK: usize = 8192;

/// Chunks that may wait, filled, for the replay at once.
pub const IN_FLIGHT: usize = 4;

/// What the reader thread sends.
enum Message {
    /// The next events, last first (the replay pops them off the end), and how many
    /// of them are allocations.
    Events(Vec<Event>, u64),
    /// The reader ended (its events are all sent): why it stopped, if it did early.
    End(Option<Unstreamable>),
}

/// An [`EventStream`] whose reader runs on a thread of its own; see the module's
/// documentation. Dropping it before the end stops the reader (at its next chunk) and
/// waits for it.
pub struct ReadAhead {
    chunks: Receiver<Message>,
    /// Emptied chunks, back to the reader.
    empties: SyncSender<Vec<Event>>,
    /// The chunk being given out, last event first (`pop` gives the next).
    chunk: Vec<Event>,
    /// The chunk's length and allocations when it came.
    chunk_events: u64,
    chunk_allocs: u64,
    /// Events and allocations of the chunks before it.
    events_before: u64,
    allocs_before: u64,
    /// The reader has ended, and why it stopped early if it did.
    ended: Option<Option<Unstreamable>>,
    /// The trace without its events, from the reader before it started (a reader's
    /// shell names the file and its format: reading does not change it).
    shell: Trace,
    /// Asks the reader to stop at its next chunk.
    stop: Arc<AtomicBool>,
    reader: Option<JoinHandle<()>>,
}

impl ReadAhead {
    /// Starts reading `stream` on a new thread.
    ///
    /// # Errors
    /// The thread does not start (the stream is dropped: open it again and read it on
    /// this thread).
    pub fn start<S: EventStream + Send + 'static>(stream: S) -> std::io::Result<ReadAhead> {
        ReadAhead::start_in(stream, CHUNK)
    }

    /// [`ReadAhead::start`] in chunks of `chunk` events.
    fn start_in<S: EventStream + Send + 'static>(
        mut stream: S,
        chunk_events: usize,
    ) -> std::io::Result<ReadAhead> {
        let (chunk_tx, chunks) = sync_channel::<Message>(IN_FLIGHT);
        let (empties, empty_rx) = sync_channel::<Vec<Event>>(IN_FLIGHT + 2);
        let stop = Arc::new(AtomicBool::new(false));
        let shell = stream.shell();
        let reader_stop = Arc::clone(&stop);
        let reader = std::thread::Builder::new()
            .name("allocsim-read-ahead".into())
            .spawn(move || loop {
                if reader_stop.load(Ordering::Relaxed) {
                    return;
                }
                let mut chunk = empty_rx
                    .try_recv()
                    .unwrap_or_else(|_| Vec::with_capacity(chunk_events));
                let mut allocs = 0;
                for event in stream.by_ref().take(chunk_events) {
                    allocs += u64::from(matches!(event, Event::Alloc { .. }));
                    chunk.push(event);
                }
                let last = chunk.len() < chunk_events;
                if !chunk.is_empty() {
                    chunk.reverse();
                    if chunk_tx.send(Message::Events(chunk, allocs)).is_err() {
                        return;
                    }
                }
                if last {
                    // The receiver may be gone: nothing to tell then.
                    let _ = chunk_tx.send(Message::End(stream.stopped()));
                    return;
                }
            })?;
        Ok(ReadAhead {
            chunks,
            empties,
            chunk: Vec::new(),
            chunk_events: 0,
            chunk_allocs: 0,
            events_before: 0,
            allocs_before: 0,
            ended: None,
            shell,
            stop,
            reader: Some(reader),
        })
    }

    /// The next chunk from the reader; `false` at the end.
    #[cold]
    #[inline(never)]
    fn refill(&mut self) -> bool {
        if self.ended.is_some() {
            return false;
        }
        self.events_before += self.chunk_events;
        self.allocs_before += self.chunk_allocs;
        (self.chunk_events, self.chunk_allocs) = (0, 0);
        // The reader may have ended: the empty chunk is dropped then.
        let _ = self.empties.try_send(std::mem::take(&mut self.chunk));
        match self.chunks.recv() {
            Ok(Message::Events(events, allocs)) => {
                self.chunk_events = events.len() as u64;
                self.chunk_allocs = allocs;
                self.chunk = events;
                true
            }
            Ok(Message::End(stopped)) => {
                self.ended = Some(stopped);
                false
            }
            // The reader panicked: its panic is raised here.
            Err(_) => {
                if let Some(reader) = self.reader.take() {
                    if let Err(panic) = reader.join() {
                        std::panic::resume_unwind(panic);
                    }
                }
                self.ended = Some(None);
                false
            }
        }
    }
}

impl Iterator for ReadAhead {
    type Item = Event;

    #[inline]
    fn next(&mut self) -> Option<Event> {
        match self.chunk.pop() {
            Some(event) => Some(event),
            None if self.refill() => self.chunk.pop(),
            None => None,
        }
    }
}

impl EventStream for ReadAhead {
    fn stopped(&self) -> Option<Unstreamable> {
        self.ended.flatten()
    }

    fn events_read(&self) -> u64 {
        self.events_before + self.chunk_events - self.chunk.len() as u64
    }

    fn allocs_read(&self) -> u64 {
        let waiting = self
            .chunk
            .iter()
            .filter(|e| matches!(e, Event::Alloc { .. }))
            .count() as u64;
        self.allocs_before + self.chunk_allocs - waiting
    }

    fn shell(&self) -> Trace {
        self.shell.clone()
    }

    type Source<'a> = &'a mut ReadAhead;

    /// The iterator itself.
    fn source(&mut self) -> &mut ReadAhead {
        self
    }
}

impl Drop for ReadAhead {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // A reader waiting to send is let go: its send fails and it returns.
        let (_, dead) = sync_channel(0);
        drop(std::mem::replace(&mut self.chunks, dead));
        if let Some(reader) = self.reader.take() {
            // A panic of the reader is not raised from a drop.
            let _ = reader.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::csv::CsvEvents;
    use crate::rmm::RmmEvents;
    use std::io::Cursor;
    use std::path::Path;

    /// A generated trace's CSV text, `events` events.
    fn csv_text(events: u64) -> String {
        let trace = crate::generate::random(&crate::RandomOptions {
            seed: 9,
            events,
            streams: 2,
            ..crate::RandomOptions::default()
        })
        .unwrap();
        let mut text = Vec::new();
        crate::write_csv(&trace, &mut text).unwrap();
        String::from_utf8(text).unwrap()
    }

    fn csv(text: &str) -> CsvEvents<Cursor<Vec<u8>>> {
        CsvEvents::new(Cursor::new(text.as_bytes().to_vec()), Path::new("t.csv"))
    }

    /// What a stream gives and says at its end: its events, counts and why it stopped.
    fn drained<S: EventStream>(mut s: S) -> (Vec<Event>, u64, u64, Option<Unstreamable>) {
        let events: Vec<Event> = s.by_ref().collect();
        (events, s.events_read(), s.allocs_read(), s.stopped())
    }

    /// Read ahead in chunks of every size, a CSV trace gives the reader's own events,
    /// counts and stop, clean or with a bad row part way.
    #[test]
    fn read_ahead_gives_the_readers_events() {
        let clean = csv_text(1000);
        let mut lines: Vec<&str> = clean.lines().collect();
        lines[600] = "alloc,x,1,0,9";
        let bad = lines.join("\n");
        for text in [clean.as_str(), bad.as_str(), "op,id,bytes,stream\n", ""] {
            let expected = drained(csv(text));
            for chunk in [1, 7, 599, 1000, 1001, CHUNK] {
                let ahead = ReadAhead::start_in(csv(text), chunk).unwrap();
                assert_eq!(drained(ahead), expected, "chunks of {chunk}");
            }
        }
        assert_eq!(drained(csv(&bad)).3, Some(Unstreamable::Problem));
        assert!(drained(csv(&clean)).0.len() >= 1000);
    }

    /// An RMM log read ahead gives the reader's own events and counts.
    #[test]
    fn read_ahead_gives_an_rmm_logs_events() {
        let text = "Thread,Time,Action,Pointer,Size,Stream\n\
                    1,10:00:00.000000,allocate,0x7f00,4096,0x0\n\
                    1,10:00:00.000001,allocate,0x8f00,512,0x0\n\
                    1,10:00:00.000002,free,0x7f00,4096,0x0\n\
                    1,10:00:00.000003,allocate,0x7f00,100,0x0\n";
        let rmm = || RmmEvents::new(Cursor::new(text.as_bytes().to_vec()), Path::new("t.log"));
        let expected = drained(rmm());
        assert_eq!((expected.0.len(), expected.2), (4, 3));
        for chunk in [1, 3, CHUNK] {
            assert_eq!(
                drained(ReadAhead::start_in(rmm(), chunk).unwrap()),
                expected
            );
        }
    }

    /// Events without end, counted as they are made; panics at `panic_at` if given.
    struct Endless {
        made: Arc<std::sync::atomic::AtomicU64>,
        panic_at: Option<u64>,
    }

    impl Iterator for Endless {
        type Item = Event;
        fn next(&mut self) -> Option<Event> {
            let n = self.made.fetch_add(1, Ordering::Relaxed);
            assert!(self.panic_at != Some(n), "reader failed at {n}");
            Some(Event::Free {
                id: crate::AllocId(n),
            })
        }
    }

    impl EventStream for Endless {
        fn stopped(&self) -> Option<Unstreamable> {
            None
        }
        fn events_read(&self) -> u64 {
            self.made.load(Ordering::Relaxed)
        }
        fn allocs_read(&self) -> u64 {
            0
        }
        fn shell(&self) -> Trace {
            crate::csv::shell_of(Path::new("endless.csv"), crate::Format::Csv)
        }
        type Source<'a> = &'a mut Endless;
        fn source(&mut self) -> &mut Endless {
            self
        }
    }

    /// Dropped part way, a read-ahead stops its reader (the drop returns, and the
    /// reader made at most the chunks that may wait, beyond those given).
    #[test]
    fn dropping_a_read_ahead_stops_its_reader() {
        let made = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let stream = Endless {
            made: Arc::clone(&made),
            panic_at: None,
        };
        let mut ahead = ReadAhead::start_in(stream, 16).unwrap();
        let first: Vec<Event> = ahead.by_ref().take(40).collect();
        assert_eq!(
            first[39],
            Event::Free {
                id: crate::AllocId(39)
            }
        );
        assert_eq!(ahead.events_read(), 40);
        drop(ahead);
        let after = made.load(Ordering::Relaxed);
        assert!(after <= 16 * (3 + IN_FLIGHT as u64 + 2), "{after} made");
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(made.load(Ordering::Relaxed), after, "the reader went on");
    }

    /// A reader's panic is raised on the thread that takes its events.
    #[test]
    fn a_readers_panic_reaches_the_replay() {
        let stream = Endless {
            made: Arc::default(),
            panic_at: Some(50),
        };
        let mut ahead = ReadAhead::start_in(stream, 16).unwrap();
        let taken =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| ahead.by_ref().count()));
        let panic = taken.unwrap_err();
        let message = panic.downcast_ref::<String>().unwrap();
        assert_eq!(message, "reader failed at 50");
    }
}
