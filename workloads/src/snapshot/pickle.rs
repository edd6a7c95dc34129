//! A streaming pickle machine built for PyTorch memory snapshots.
//!
//! It runs the opcodes of pickle protocols 0 to 5 (as Python's `pickle` module writes
//! them) over a buffered reader, one pass, with no recursion, and builds values as it
//! goes, except where a snapshot's shape lets it do better:
//!
//! - **Trace entries and segments become typed records when their list receives
//!   them.** A dict appended to a list is classified by its keys (`action`: a trace
//!   entry; `blocks` or `total_size`: a segment) and converted on the spot
//!   ([`super::schema`]); its generic form, and its memo slot, are dropped. A trace of
//!   millions of entries is thus held as compact records, never as a value tree.
//! - **Most entries never become values.** Once a list holds trace entries, the
//!   EMPTY_DICT (or MARK) that opens the next entry starts the entry lane
//!   ([`Machine::entry_lane`]), which decodes the few opcodes entries are made of
//!   straight from the input buffer into the entry's record: keys known by their memo
//!   slot, values into their fields, stack frames run through without being stored
//!   ([`Machine::lane_skip`]); no dict, no key or value on the stack. At anything else
//!   it goes back to the entry's start and hands the entry to the general machine,
//!   which reads it as it would have without the lane (the record is then made at the
//!   entry's SETITEMS, or the error named).
//! - **Values nobody reads are skipped.** A container stored under a key of
//!   [`SKIP_KEYS`] (stack frames unless asked for, `forward_frames`,
//!   `internal_metadata`, the host allocator's traces) and everything inside it is
//!   [`Value::Skipped`]: its opcodes run, nothing is stored.
//!
//! Every resource is bounded, so hostile bytes give an error, not a crash: containers
//! nest at most [`Limits::max_nesting`] levels (checked when a container receives a
//! value, and containers are sealed once placed in another, so memo references cannot
//! build deeper chains later), open MARKs, pending stack values, single arguments and
//! containers built are capped, integers too long for 64 bits are never converted, and
//! the input is read in blocks as the machine consumes it (an endless source stops at
//! the first byte that is not a pickle, or at a cap).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::io::{self, Read};
use std::rc::Rc;

use super::schema::{EntrySink, EntryStore, Frame, FrameTable, LaneKey, RawEntry, SegmentStore};

/// Keys whose values are not kept (and, unless frames are asked for, `frames`).
pub(crate) const SKIP_KEYS: [&str; 4] = [
    "forward_frames",
    "internal_metadata",
    "host_segments",
    "host_traces",
];

/// Resource caps of one read.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// Deepest container nesting accepted (real snapshots nest about six levels).
    pub max_nesting: u32,
    /// Most MARKs open at once (a real snapshot needs one per nesting level).
    pub max_marks: usize,
    /// Most values waiting on the stack (Python's pickler batches 1000 items a level).
    pub max_stack: usize,
    /// Largest single string, bytes or text-line argument.
    pub max_argument: usize,
    /// Most bytes read (the file's size when known).
    pub max_input: u64,
    /// In a streamed read, memo slots kept densely: beyond twice this many, the
    /// oldest are let go unless looked up once or holding a container (see
    /// [`Machine::memo_compact`]); 0 keeps every slot.
    pub memo_window: usize,
    /// Segments are counted, not kept (a streamed replay's second pass, which needs
    /// only the trace).
    pub skip_segments: bool,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_nesting: 256,
            max_marks: 1024,
            max_stack: 1 << 20,
            max_argument: 64 << 20,
            max_input: 16 << 30,
            memo_window: 0,
            skip_segments: false,
        }
    }
}

/// A value on the pickle machine's stack or in its memo. 16 bytes.
#[derive(Clone)]
pub(crate) enum Value {
    None,
    Bool(bool),
    Int(i64),
    /// An integer in `[2^63, 2^64)`.
    Big(u64),
    /// An integer outside `[-2^63, 2^64)`; its digits are not kept.
    Huge,
    Float(f64),
    Str(Rc<String>),
    /// A bytes object (content not kept: snapshots hold none).
    Bytes,
    Tuple(Rc<Tuple>),
    List(Rc<List>),
    Dict(Rc<Dict>),
    /// A Python object other than the plain types: a class reference, or what
    /// calling one built. Named by its class.
    Object(Rc<String>),
    /// Content not kept (see the module docs).
    Skipped,
    /// A trace entry or segment already converted to its record.
    Consumed,
    /// A list of stack frames already converted: its index in the frame table.
    Stack(u32),
    /// A stack frame dict the entry lane decoded without making the dict: its index
    /// in the frame table. Only ever in the memo: a memo reference outside the lane
    /// makes the dict then ([`Machine::frame_dict`]).
    Frame(u32),
    /// A trace entry the entry lane read and stored in its list already: the list's
    /// APPENDS passes over it (see [`Machine::entry_lane`]).
    Record,
}

impl Value {
    /// What the value is, for messages ("an int", "a dict").
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool(_) => "a bool",
            Value::Int(_) | Value::Big(_) | Value::Huge => "an int",
            Value::Float(_) => "a float",
            Value::Str(_) => "a string",
            Value::Bytes => "bytes",
            Value::Tuple(_) => "a tuple",
            Value::List(_) => "a list",
            Value::Dict(_) => "a dict",
            Value::Object(_) => "a Python object",
            Value::Skipped => "a value that was not kept",
            Value::Consumed => "a trace entry or segment used twice",
            Value::Stack(_) => "a list of stack frames",
            Value::Frame(_) => "a stack frame",
            Value::Record => "a trace entry already read",
        }
    }

    /// Nesting depth: 0 for a scalar, one more than the deepest element for a container.
    fn depth(&self) -> u32 {
        match self {
            Value::Tuple(t) => t.depth,
            Value::List(l) => l.depth.get(),
            Value::Dict(d) => d.depth.get(),
            _ => 0,
        }
    }

    /// Marks a container as placed inside another: it may not change any more.
    fn seal(&self) {
        match self {
            Value::List(l) => l.sealed.set(true),
            Value::Dict(d) => d.sealed.set(true),
            _ => {}
        }
    }

    pub(crate) fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }
}

/// An immutable tuple.
pub(crate) struct Tuple {
    pub items: Vec<Value>,
    depth: u32,
}

/// What a list holds: values, or the records its elements were converted to.
pub(crate) enum Items {
    Values(Vec<Value>),
    Entries(Box<EntryStore>),
    Segments(Box<SegmentStore>),
}

/// A list. Containers are shared through the memo (`Rc`), so they mutate in place.
pub(crate) struct List {
    pub items: RefCell<Items>,
    sealed: Cell<bool>,
    depth: Cell<u32>,
    /// Its memo key, so that converting it (stack frames) can free the slot.
    memo: Cell<Option<u64>>,
}

/// A dict, its items in insertion order, flat: key, value, key, value...
pub(crate) struct Dict {
    pub items: RefCell<Vec<Value>>,
    sealed: Cell<bool>,
    depth: Cell<u32>,
    /// Its memo key, so that converting it to a record can free the slot.
    memo: Cell<Option<u64>>,
}

impl Dict {
    /// The value of string key `key` (the last one, as Python keeps it).
    pub(crate) fn get(&self, key: &str) -> Option<Value> {
        self.items
            .borrow()
            .chunks_exact(2)
            .rev()
            .find(|kv| kv[0].as_str() == Some(key))
            .map(|kv| kv[1].clone())
    }

    fn has(&self, key: &str) -> bool {
        self.items
            .borrow()
            .chunks_exact(2)
            .any(|kv| kv[0].as_str() == Some(key))
    }
}

/// Why the machine stopped.
#[derive(Debug)]
pub(crate) enum PickleError {
    /// Reading failed.
    Io(io::Error),
    /// The bytes are not a pickle this reader accepts; `offset` is where it stopped.
    Bad { offset: u64, message: String },
}

/// Boxed, so that the machine's results stay small on the hot path.
type Result<T> = std::result::Result<T, Box<PickleError>>;

/// Buffered input with the offset of every byte, for messages.
struct Input<R> {
    reader: R,
    buf: Vec<u8>,
    pos: usize,
    end: usize,
    /// Offset of `buf[0]` in the input.
    base: u64,
    eof: bool,
    max_input: u64,
}

const BLOCK: usize = 1 << 18;

impl<R: Read> Input<R> {
    fn new(reader: R, max_input: u64) -> Input<R> {
        Input {
            reader,
            buf: vec![0; BLOCK],
            pos: 0,
            end: 0,
            base: 0,
            eof: false,
            max_input,
        }
    }

    fn offset(&self) -> u64 {
        self.base + self.pos as u64
    }

    /// Reads more input so that at least `n` bytes (n <= BLOCK) are buffered, unless
    /// the input ends first. Returns whether they are.
    fn fill(&mut self, n: usize) -> Result<bool> {
        if self.end - self.pos >= n {
            return Ok(true);
        }
        if self.pos > 0 {
            self.buf.copy_within(self.pos..self.end, 0);
            self.base += self.pos as u64;
            self.end -= self.pos;
            self.pos = 0;
        }
        while self.end < n && !self.eof {
            let got = match self.reader.read(&mut self.buf[self.end..]) {
                Ok(got) => got,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(Box::new(PickleError::Io(e))),
            };
            if got == 0 {
                self.eof = true;
            }
            self.end += got;
            if self.base + self.end as u64 > self.max_input {
                return Err(Box::new(PickleError::Bad {
                    offset: self.max_input,
                    message: format!(
                        "the input goes on past {} bytes without ending the pickle",
                        self.max_input
                    ),
                }));
            }
        }
        Ok(self.end - self.pos >= n)
    }

    #[inline]
    fn byte(&mut self) -> Result<Option<u8>> {
        if self.pos == self.end && !self.fill(1)? {
            return Ok(None);
        }
        let b = self.buf[self.pos];
        self.pos += 1;
        Ok(Some(b))
    }

    fn truncated(&self, what: &str) -> Box<PickleError> {
        Box::new(PickleError::Bad {
            offset: self.offset(),
            message: format!("the pickle ends inside {what}"),
        })
    }

    /// The next `n` bytes, `n <= BLOCK`.
    #[inline]
    fn take(&mut self, n: usize, what: &str) -> Result<&[u8]> {
        if self.end - self.pos < n && !self.fill(n)? {
            return Err(self.truncated(what));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    /// The next `n` bytes of any size, read as they arrive (a bogus length cannot make
    /// it allocate more than the input holds).
    fn take_long(&mut self, n: usize, what: &str) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(n.min(BLOCK));
        while out.len() < n {
            if self.pos == self.end && !self.fill(1)? {
                return Err(self.truncated(what));
            }
            let k = (n - out.len()).min(self.end - self.pos);
            out.extend_from_slice(&self.buf[self.pos..self.pos + k]);
            self.pos += k;
        }
        Ok(out)
    }

    /// A newline-terminated text argument, without the newline.
    fn line(&mut self, max: usize, what: &str) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        loop {
            if self.pos == self.end && !self.fill(1)? {
                return Err(self.truncated(what));
            }
            let chunk = &self.buf[self.pos..self.end];
            match chunk.iter().position(|&b| b == b'\n') {
                Some(i) => {
                    out.extend_from_slice(&chunk[..i]);
                    self.pos += i + 1;
                    break;
                }
                None => {
                    out.extend_from_slice(chunk);
                    self.pos = self.end;
                }
            }
            if out.len() > max {
                return Err(Box::new(PickleError::Bad {
                    offset: self.offset(),
                    message: format!("{what} is longer than {max} bytes"),
                }));
            }
        }
        if out.len() > max {
            return Err(Box::new(PickleError::Bad {
                offset: self.offset(),
                message: format!("{what} is longer than {max} bytes"),
            }));
        }
        Ok(out)
    }
}

/// The pickle machine.
pub(crate) struct Machine<R> {
    input: Input<R>,
    limits: Limits,
    stack: Vec<Value>,
    marks: Vec<usize>,
    /// Memo slots from key `memo_base` on (below it: `memo_sparse`, or let go).
    memo: Vec<Value>,
    memo_base: usize,
    /// With `Limits::memo_window`: each slot of `memo`'s [`USED`] and [`PER_ENTRY`].
    memo_used: Vec<u8>,
    /// Memo keys beyond the dense range (protocol 0-3 `PUT`s of other numbers), and
    /// the slots kept below `memo_base`.
    memo_sparse: HashMap<u64, Value>,
    /// Short strings seen, shared (keys, actions, `'N/A'` appear millions of times).
    strings: HashMap<Box<[u8]>, Rc<String>, BuildHasherDefault<Fnv>>,
    keep_frames: bool,
    containers: u64,
    /// Converted entry dicts, cleared, for the next ones.
    dict_pool: Vec<Rc<Dict>>,
    /// Stack frames, when kept.
    frames: FrameTable,
    /// Offset of the opcode being run.
    at: u64,
    /// Whether the entry lane may run (always, but in tests that compare it with the
    /// general machine: [`without_lane`]).
    lane: bool,
    /// The entry lane's stack and MARKs in a value not kept ([`Machine::lane_skip`]).
    skip: Vec<Value>,
    skip_marks: Vec<usize>,
    /// Strings of the interner met lately (see [`Machine::string`]).
    recent: [Option<Rc<String>>; RECENT],
    /// The entry lane's kinds of keys by memo slot (see [`Machine::lane_key`]).
    key_cache: [(u64, LaneKey); KEY_CACHE],
    /// A streamed read: the sink of each list of entries, by its serial number
    /// (`snapshot::stream`); `None` keeps the entries in their stores.
    sinks: Option<SinkFactory>,
    /// Lists of entries met so far.
    entry_lists: u32,
    /// The frame indexes of the stack the entry lane is reading (frames kept).
    stack_buf: Vec<u32>,
    /// The frame table's frame count and the containers counted when the entry lane
    /// started its entry, to go back to when it hands over.
    lane_mark: (usize, u64),
}

/// The stack frames of the entry the entry lane reads, when kept.
#[derive(Clone, Copy)]
enum LaneStack {
    /// None (no `frames`, or not a list).
    None,
    /// A list of frames read before, by memo reference: its stack index.
    Shared(u32),
    /// A list read now into [`Machine::stack_buf`]; its memo slot, if memoized.
    New(Option<usize>),
}

/// A memo slot looked up at least once.
const USED: u8 = 1;
/// A memo slot of a value the entry lane does not read (`compile_context`...),
/// memoized anew with each entry.
const PER_ENTRY: u8 = 2;

/// Makes the sink of the entry list with the given serial number.
pub(crate) type SinkFactory = Box<dyn FnMut(u32) -> EntrySink>;

/// FNV-1a, for the interner's short strings and the frame table's keys (the default
/// hasher costs more than the lookups save).
#[derive(Default)]
pub(crate) struct Fnv(u64);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.0
        };
        for &b in bytes {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = h;
    }
}

const INTERN_MAX_LEN: usize = 32;
/// Bytes the entry lane wants buffered when it starts: an entry longer than this
/// (about 100 bytes without frames, a few hundred with them) goes to the general
/// machine.
const LANE_WINDOW: usize = 16 << 10;
/// Bytes the entry lane wants left before each opcode: the longest it reads (a
/// BINUNICODE of `INTERN_MAX_LEN` bytes).
const LANE_LOOKAHEAD: usize = 5 + INTERN_MAX_LEN;
/// Memo slots whose kind of key the entry lane remembers (by a hash of the slot:
/// keys are memoized where they first appear, often at nearby slots).
const KEY_CACHE: usize = 512;

fn key_slot(index: usize) -> usize {
    ((index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 55) as usize
}
/// Short strings the interner remembers by their length and ends, before its map.
const RECENT: usize = 16;
const INTERN_MAX_COUNT: usize = 4096;

thread_local! {
    /// Set by [`without_lane`].
    static NO_LANE: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with the entry lane off in this thread's pickle machines, so that tests
/// can check that it reads every entry as the general machine does.
#[cfg(test)]
pub(crate) fn without_lane<T>(f: impl FnOnce() -> T) -> T {
    NO_LANE.with(|c| c.set(true));
    let out = f();
    NO_LANE.with(|c| c.set(false));
    out
}

impl<R: Read> Machine<R> {
    pub(crate) fn new(reader: R, limits: Limits, keep_frames: bool) -> Machine<R> {
        Machine {
            input: Input::new(reader, limits.max_input),
            limits,
            stack: Vec::new(),
            marks: Vec::new(),
            memo: Vec::new(),
            memo_base: 0,
            memo_used: Vec::new(),
            memo_sparse: HashMap::new(),
            strings: HashMap::default(),
            keep_frames,
            containers: 0,
            dict_pool: Vec::new(),
            frames: FrameTable::default(),
            at: 0,
            lane: !NO_LANE.with(Cell::get),
            skip: Vec::new(),
            skip_marks: Vec::new(),
            recent: Default::default(),
            key_cache: [(u64::MAX, LaneKey::Other); KEY_CACHE],
            sinks: None,
            entry_lists: 0,
            stack_buf: Vec::new(),
            lane_mark: (0, 0),
        }
    }

    fn bad(&self, message: impl Into<String>) -> Box<PickleError> {
        Box::new(PickleError::Bad {
            offset: self.at,
            message: message.into(),
        })
    }

    fn pop(&mut self) -> Result<Value> {
        if self.marks.last().is_some_and(|&m| m >= self.stack.len()) {
            return Err(self.bad("an opcode takes a value from below a MARK"));
        }
        self.stack.pop().ok_or_else(|| self.bad("stack underflow"))
    }

    fn top(&self) -> Result<&Value> {
        self.stack.last().ok_or_else(|| self.bad("stack underflow"))
    }

    #[inline]
    fn push(&mut self, v: Value) -> Result<()> {
        if self.stack.len() >= self.limits.max_stack {
            return Err(self.stack_full());
        }
        self.stack.push(v);
        Ok(())
    }

    #[cold]
    fn stack_full(&self) -> Box<PickleError> {
        self.bad(format!(
            "more than {} values wait on the pickle stack: not a PyTorch memory snapshot",
            self.limits.max_stack
        ))
    }

    /// Pops everything above the last MARK, and the MARK.
    fn pop_mark(&mut self) -> Result<Vec<Value>> {
        let at = self
            .marks
            .pop()
            .ok_or_else(|| self.bad("no MARK to pop to"))?;
        Ok(self.stack.split_off(at))
    }

    /// Counts a container built, within a budget proportional to the input read.
    fn count_container(&mut self) -> Result<()> {
        self.containers += 1;
        if self.containers > (1 << 20) + self.input.offset() / 4 {
            return Err(self.bad(
                "more containers than the input could describe: not a PyTorch memory snapshot",
            ));
        }
        Ok(())
    }

    /// Whether the values pushed now go to a skipped container (the one below the
    /// last MARK).
    #[inline]
    fn in_skipped_batch(&self) -> bool {
        match self.marks.last() {
            Some(&m) if m > 0 => matches!(self.stack.get(m - 1), Some(Value::Skipped)),
            _ => false,
        }
    }

    /// Whether a container created now is stored under a skipped key or inside a
    /// skipped container (see the module docs).
    fn new_container_skipped(&self) -> bool {
        let p = self.stack.len();
        let owner = match self.marks.last() {
            Some(&m) if m > 0 => Some((m, &self.stack[m - 1])),
            _ => None,
        };
        if let Some((_, Value::Skipped)) = owner {
            return true;
        }
        match self.stack.last() {
            Some(Value::Str(key)) => {
                SKIP_KEYS.contains(&key.as_str()) || (!self.keep_frames && key.as_str() == "frames")
            }
            Some(Value::Skipped) => match owner {
                // A container cannot be a dict's key: it is the skipped top's element.
                Some((m, Value::Dict(_))) => (p - m) % 2 == 0,
                Some((_, _)) => false,
                None => true,
            },
            _ => false,
        }
    }

    fn new_list(&mut self, items: Vec<Value>) -> Result<Value> {
        if self.new_container_skipped() {
            return Ok(Value::Skipped);
        }
        self.count_container()?;
        let list = Rc::new(List {
            items: RefCell::new(Items::Values(Vec::new())),
            sealed: Cell::new(false),
            depth: Cell::new(1),
            memo: Cell::new(None),
        });
        self.extend_list(&list, items.into_iter())?;
        Ok(Value::List(list))
    }

    fn new_dict(&mut self, items: Vec<Value>) -> Result<Value> {
        if self.new_container_skipped() {
            return Ok(Value::Skipped);
        }
        self.count_container()?;
        let dict = self.dict_pool.pop().unwrap_or_else(|| {
            Rc::new(Dict {
                items: RefCell::new(Vec::new()),
                sealed: Cell::new(false),
                depth: Cell::new(1),
                memo: Cell::new(None),
            })
        });
        self.set_items(&Value::Dict(dict.clone()), items)?;
        Ok(Value::Dict(dict))
    }

    fn new_tuple(&mut self, items: Vec<Value>) -> Result<Value> {
        let depth = items.iter().map(Value::depth).max().unwrap_or(0) + 1;
        if depth > self.limits.max_nesting {
            return Err(self.too_deep());
        }
        items.iter().for_each(Value::seal);
        Ok(Value::Tuple(Rc::new(Tuple { items, depth })))
    }

    fn too_deep(&self) -> Box<PickleError> {
        self.bad(format!(
            "values nest more than {} levels deep: not a PyTorch memory snapshot",
            self.limits.max_nesting
        ))
    }

    /// Checks that `container` may receive `values` and raises its depth.
    fn admit(&self, sealed: &Cell<bool>, depth: &Cell<u32>, values: &[Value]) -> Result<()> {
        if sealed.get() {
            return Err(self.sealed_error());
        }
        let inner = values.iter().map(Value::depth).max().unwrap_or(0);
        if inner >= self.limits.max_nesting {
            return Err(self.too_deep());
        }
        depth.set(depth.get().max(inner + 1));
        values.iter().for_each(Value::seal);
        if sealed.get() {
            // It was among the values: a container inside itself.
            return Err(self.bad("a container contains itself: not a PyTorch memory snapshot"));
        }
        Ok(())
    }

    /// Where the top `n` values start, if none is below the last MARK.
    fn top_n(&self, n: usize) -> Result<usize> {
        let floor = self.marks.last().copied().unwrap_or(0);
        match self.stack.len().checked_sub(n) {
            Some(at) if at >= floor => Ok(at),
            _ => Err(self.bad("stack underflow")),
        }
    }

    /// APPEND(S) or SETITEM(S): moves `stack[at..]` into the container at `at - 1`.
    fn insert_from(&mut self, at: usize) -> Result<()> {
        let target = match at.checked_sub(1).and_then(|t| self.stack.get(t)) {
            Some(t) => t.clone(),
            None => return Err(self.bad("stack underflow")),
        };
        match &target {
            Value::List(l) => {
                let mut stack = std::mem::take(&mut self.stack);
                let result = self.extend_list(l, stack.drain(at..));
                self.stack = stack;
                result
            }
            Value::Dict(d) => {
                if (self.stack.len() - at) % 2 != 0 {
                    return Err(self.bad("a dict receives a key without a value"));
                }
                self.admit(&d.sealed, &d.depth, &self.stack[at..])?;
                let mut map = d.items.borrow_mut();
                map.extend(self.stack.drain(at..));
                Ok(())
            }
            Value::Skipped | Value::Object(_) => {
                self.stack.truncate(at);
                Ok(())
            }
            other => Err(self.bad(format!(
                "values are added to {}, not a list or dict",
                other.kind()
            ))),
        }
    }

    /// Appends to a list, converting trace entries and segments to records.
    fn extend_list(&mut self, list: &List, values: impl Iterator<Item = Value>) -> Result<()> {
        if list.sealed.get() {
            return Err(self.sealed_error());
        }
        let mut items = list.items.borrow_mut();
        for v in values {
            let depth = v.depth();
            if depth >= self.limits.max_nesting {
                return Err(self.too_deep());
            }
            if depth >= list.depth.get() {
                list.depth.set(depth + 1);
            }
            v.seal();
            if list.sealed.get() {
                return Err(self.bad("a container contains itself: not a PyTorch memory snapshot"));
            }
            if let Items::Values(vec) = &*items {
                if vec.is_empty() {
                    if let Value::Dict(d) = &v {
                        if d.has("action") {
                            *items = Items::Entries(Box::new(self.entry_store()));
                        } else if d.has("blocks") || d.has("total_size") {
                            *items = Items::Segments(Box::new(SegmentStore::new(
                                self.limits.skip_segments,
                            )));
                        }
                    }
                }
            }
            match &mut *items {
                Items::Values(vec) => vec.push(v),
                // Stored by the entry lane already.
                Items::Entries(_) if matches!(v, Value::Record) => {}
                Items::Entries(store) => {
                    self.release(&v);
                    let stack = if self.keep_frames {
                        self.entry_frames(&v)
                    } else {
                        Ok(None)
                    };
                    store.push(&v, stack);
                    self.recycle(v);
                }
                Items::Segments(store) => {
                    self.release(&v);
                    store.push(&v);
                }
            }
        }
        Ok(())
    }

    /// The store of a list that received its first entry: with its sink in a
    /// streamed read.
    fn entry_store(&mut self) -> EntryStore {
        let serial = self.entry_lists;
        self.entry_lists = self.entry_lists.saturating_add(1);
        let mut store = EntryStore::default();
        store.sink = self.sinks.as_mut().map(|make| make(serial));
        store.serial = serial;
        store
    }

    /// Converts an entry's stack frames into the frame table, and leaves the table's
    /// index in the frames list's memo slot (its values are not needed any more).
    fn entry_frames(&mut self, entry: &Value) -> std::result::Result<Option<u32>, String> {
        let Value::Dict(d) = entry else {
            return Ok(None);
        };
        self.frames_stack(d.get("frames"))
    }

    /// Converts an entry's `frames` value into the frame table (see
    /// [`Machine::entry_frames`]).
    fn frames_stack(&mut self, frames: Option<Value>) -> std::result::Result<Option<u32>, String> {
        let stack = self.frames.stack_of(frames.as_ref())?;
        if let (Some(Value::List(l)), Some(k)) = (&frames, stack) {
            if let Some(key) = l.memo.take() {
                match self.dense(key) {
                    Some(i) => self.memo[i] = Value::Stack(k),
                    None => {
                        self.memo_sparse.insert(key, Value::Stack(k));
                    }
                }
            }
        }
        Ok(stack)
    }

    /// Keeps a converted dict for reuse when nothing else refers to it.
    fn recycle(&mut self, v: Value) {
        if let Value::Dict(d) = v {
            if Rc::strong_count(&d) == 1 && self.dict_pool.len() < 256 {
                d.items.borrow_mut().clear();
                d.sealed.set(false);
                d.depth.set(1);
                d.memo.set(None);
                self.dict_pool.push(d);
            }
        }
    }

    #[cold]
    fn sealed_error(&self) -> Box<PickleError> {
        self.bad(
            "the pickle changes a container after placing it in another: not a PyTorch memory snapshot",
        )
    }

    /// Frees the memo slot of a dict about to become a record.
    fn release(&mut self, v: &Value) {
        if let Value::Dict(d) = v {
            if let Some(key) = d.memo.take() {
                match self.dense(key) {
                    Some(k) => self.memo[k] = Value::Consumed,
                    None => {
                        self.memo_sparse.insert(key, Value::Consumed);
                    }
                }
            }
        }
    }

    /// DICT and friends: a new dict from key-value pairs.
    fn set_items(&mut self, target: &Value, items: Vec<Value>) -> Result<()> {
        if items.len() % 2 != 0 {
            return Err(self.bad("a dict receives a key without a value"));
        }
        match target {
            Value::Dict(d) => {
                self.admit(&d.sealed, &d.depth, &items)?;
                d.items.borrow_mut().extend(items);
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn memo_put(&mut self, key: u64) -> Result<()> {
        let v = self.top()?.clone();
        self.memo_compact();
        self.memo_put_value(key, v)
    }

    /// The key the next MEMOIZE takes.
    #[inline]
    fn memo_end(&self) -> usize {
        self.memo_base + self.memo.len()
    }

    /// Where `key` is in `memo`, if there.
    #[inline]
    fn dense(&self, key: u64) -> Option<usize> {
        usize::try_from(key)
            .ok()
            .and_then(|k| k.checked_sub(self.memo_base))
            .filter(|&i| i < self.memo.len())
    }

    #[inline]
    fn memo_push(&mut self, v: Value) {
        self.memo.push(v);
        if self.limits.memo_window > 0 {
            self.memo_used.push(0);
        }
    }

    /// The value of memo slot `key` (dense, or kept below the dense range), marked
    /// as looked up.
    #[inline]
    fn memo_lookup(&mut self, key: usize) -> Option<&Value> {
        match key
            .checked_sub(self.memo_base)
            .filter(|&i| i < self.memo.len())
        {
            Some(i) => {
                if let Some(u) = self.memo_used.get_mut(i) {
                    *u |= USED;
                }
                self.memo.get(i)
            }
            None => self.memo_sparse.get(&(key as u64)),
        }
    }

    /// In a streamed read (`Limits::memo_window`), lets the oldest memo slots go once
    /// the dense memo holds twice the window: of the oldest window's slots, those
    /// looked up at least once, and any but an entry's dict already a record (or a
    /// value not kept) or a value the entry lane memoized and does not read
    /// ([`PER_ENTRY`]: `compile_context`'s 'N/A', written anew with each entry; keys
    /// and actions are kept, whenever they are next referred to), move to
    /// `memo_sparse`; the others are dropped. A later reference to a
    /// dropped slot fails the read ("memo key N was never stored"), and the streamed
    /// replay then reads the file whole, which keeps every slot. So memory follows
    /// the slots in use, not the number of entries.
    fn memo_compact(&mut self) {
        let window = self.limits.memo_window;
        // Frames kept index the memo by slot directly (`lane_stack`, `frame_dict`):
        // a streamed read keeps none.
        if window == 0 || self.keep_frames || self.memo.len() < 2 * window {
            return;
        }
        let base = self.memo_base as u64;
        let flags: Vec<u8> = self.memo_used.drain(..window).collect();
        for (i, (v, flags)) in self.memo.drain(..window).zip(flags).enumerate() {
            let droppable = flags & PER_ENTRY != 0
                || matches!(
                    v,
                    Value::Consumed | Value::Record | Value::Skipped | Value::Stack(_)
                );
            let keep = flags & USED != 0 || !droppable;
            if keep {
                self.memo_sparse.insert(base + i as u64, v);
            }
        }
        self.memo_base += window;
    }

    fn memo_put_value(&mut self, key: u64, v: Value) -> Result<()> {
        match &v {
            Value::Dict(d) => d.memo.set(Some(key)),
            Value::List(l) => l.memo.set(Some(key)),
            _ => {}
        }
        if key == self.memo_end() as u64 {
            self.memo_push(v);
        } else if let Some(i) = self.dense(key) {
            self.memo[i] = v;
            if let Some(u) = self.memo_used.get_mut(i) {
                *u = 0;
            }
            // The entry lane's kind of key for this slot may be stale.
            self.key_cache[key_slot(key as usize)] = (u64::MAX, LaneKey::Other);
        } else {
            if self.memo_sparse.len() >= self.limits.max_stack {
                return Err(self.bad("too many scattered memo keys: not a PyTorch memory snapshot"));
            }
            self.memo_sparse.insert(key, v);
        }
        Ok(())
    }

    fn memo_get(&mut self, key: u64) -> Result<()> {
        // Inside a skipped container the value would be dropped: do not look it up
        // (stack frames are mostly memo references, scattered over a large memo).
        if self.in_skipped_batch() {
            return self.push(Value::Skipped);
        }
        let v = match self
            .memo_lookup(key as usize)
            .filter(|_| key <= usize::MAX as u64)
        {
            Some(&Value::Frame(index)) => self.frame_dict(key, index),
            Some(v) => v.clone(),
            None => self
                .memo_sparse
                .get(&key)
                .cloned()
                .ok_or_else(|| self.bad(format!("memo key {key} was never stored")))?,
        };
        self.push(v)
    }

    /// The dict of frame `index`, which the entry lane decoded from memo slot `key`
    /// without making it: made now, as the general machine would have made it (the
    /// lane takes only frame dicts of `filename`, `line` and `name` in that order, in a
    /// list of frames, so sealed), and in the slot from now on, so that every later
    /// reference is the same dict, standing for the same frame.
    #[cold]
    fn frame_dict(&mut self, key: u64, index: u32) -> Value {
        let frame = self.frames.frame(index).clone();
        let items = vec![
            self.string(b"filename"),
            Value::Str(Rc::new(frame.filename)),
            self.string(b"line"),
            Value::Int(frame.line as i64),
            self.string(b"name"),
            Value::Str(Rc::new(frame.name)),
        ];
        let dict = Rc::new(Dict {
            items: RefCell::new(items),
            sealed: Cell::new(true),
            depth: Cell::new(1),
            memo: Cell::new(Some(key)),
        });
        self.frames.register_dict(dict.clone(), index);
        self.memo[key as usize] = Value::Dict(dict.clone());
        Value::Dict(dict)
    }

    fn string(&mut self, bytes: &[u8]) -> Value {
        if bytes.len() <= INTERN_MAX_LEN {
            // The same few strings ('N/A', actions) come in every entry.
            let slot = match (bytes.first(), bytes.last()) {
                (Some(&first), Some(&last)) => {
                    (bytes.len() ^ usize::from(first) ^ (usize::from(last) << 2)) % RECENT
                }
                _ => 0,
            };
            if let Some(s) = &self.recent[slot] {
                if s.as_bytes() == bytes {
                    return Value::Str(s.clone());
                }
            }
            if let Some(s) = self.strings.get(bytes) {
                let s = s.clone();
                self.recent[slot] = Some(s.clone());
                return Value::Str(s);
            }
        }
        let s = Rc::new(String::from_utf8_lossy(bytes).into_owned());
        if bytes.len() <= INTERN_MAX_LEN && self.strings.len() < INTERN_MAX_COUNT {
            self.strings.insert(bytes.into(), s.clone());
        }
        Value::Str(s)
    }

    /// A string argument of `n` bytes.
    fn string_arg(&mut self, n: u64, what: &str) -> Result<Value> {
        let n = self.arg_len(n, what)?;
        if n <= INTERN_MAX_LEN {
            let mut short = [0u8; INTERN_MAX_LEN];
            short[..n].copy_from_slice(self.input.take(n, what)?);
            Ok(self.string(&short[..n]))
        } else if n <= BLOCK {
            let bytes = self.input.take(n, what)?;
            Ok(Value::Str(Rc::new(
                String::from_utf8_lossy(bytes).into_owned(),
            )))
        } else {
            let bytes = self.input.take_long(n, what)?;
            Ok(Value::Str(Rc::new(
                String::from_utf8_lossy(&bytes).into_owned(),
            )))
        }
    }

    fn skip_arg(&mut self, n: u64, what: &str) -> Result<()> {
        let n = self.arg_len(n, what)?;
        let mut left = n;
        while left > 0 {
            let k = left.min(BLOCK);
            self.input.take(k, what)?;
            left -= k;
        }
        Ok(())
    }

    fn arg_len(&self, n: u64, what: &str) -> Result<usize> {
        match usize::try_from(n) {
            Ok(n) if n <= self.limits.max_argument => Ok(n),
            _ => Err(self.bad(format!(
                "{what} of {n} bytes is larger than {} bytes: not a PyTorch memory snapshot",
                self.limits.max_argument
            ))),
        }
    }

    fn uint(&mut self, n: usize, what: &str) -> Result<u64> {
        let s = self.input.take(n, what)?;
        Ok(s.iter()
            .rev()
            .fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
    }

    fn line(&mut self, what: &str) -> Result<Vec<u8>> {
        self.input.line(self.limits.max_argument, what)
    }

    /// Runs the machine to its STOP and returns the pickled value.
    pub(crate) fn run(&mut self) -> Result<Value> {
        loop {
            self.at = self.input.offset();
            let Some(op) = self.input.byte()? else {
                return Err(self.bad(if self.at == 0 {
                    "the input is empty, not a pickle".to_string()
                } else {
                    "the pickle ends without its STOP opcode".to_string()
                }));
            };
            match op {
                b'.' => {
                    // STOP
                    let v = self.pop()?;
                    return Ok(v);
                }
                0x80 => {
                    // PROTO
                    let p = self.uint(1, "PROTO")?;
                    if p > 5 {
                        return Err(
                            self.bad(format!("pickle protocol {p} is not known (0 to 5 are)"))
                        );
                    }
                }
                0x95 => {
                    self.uint(8, "FRAME")?;
                }
                b'N' => self.push(Value::None)?,
                0x88 => self.push(Value::Bool(true))?,
                0x89 => self.push(Value::Bool(false))?,
                b'J' => {
                    let v = self.uint(4, "BININT")? as u32 as i32;
                    self.push(Value::Int(i64::from(v)))?;
                }
                b'K' => {
                    let v = self.uint(1, "BININT1")?;
                    self.push(Value::Int(v as i64))?;
                }
                b'M' => {
                    let v = self.uint(2, "BININT2")?;
                    self.push(Value::Int(v as i64))?;
                }
                0x8a => {
                    let n = self.uint(1, "LONG1")?;
                    let v = self.long_arg(n)?;
                    self.push(v)?;
                }
                0x8b => {
                    let n = self.uint(4, "LONG4")? as u32 as i32;
                    if n < 0 {
                        return Err(self.bad("LONG4 with a negative length"));
                    }
                    let v = self.long_arg(n as u64)?;
                    self.push(v)?;
                }
                b'I' => {
                    let text = self.line("an INT argument")?;
                    let v = match &text[..] {
                        b"01" => Value::Bool(true),
                        b"00" => Value::Bool(false),
                        t => self.decimal(t, "INT")?,
                    };
                    self.push(v)?;
                }
                b'L' => {
                    let mut text = self.line("a LONG argument")?;
                    if text.last() == Some(&b'L') {
                        text.pop();
                    }
                    let v = self.decimal(&text, "LONG")?;
                    self.push(v)?;
                }
                b'G' => {
                    let s = self.input.take(8, "BINFLOAT")?;
                    let v = f64::from_be_bytes(s.try_into().expect("8 bytes"));
                    self.push(Value::Float(v))?;
                }
                b'F' => {
                    let text = self.line("a FLOAT argument")?;
                    let v = std::str::from_utf8(&text)
                        .ok()
                        .and_then(|t| t.trim().parse::<f64>().ok())
                        .ok_or_else(|| self.bad("a FLOAT argument that is not a number"))?;
                    self.push(Value::Float(v))?;
                }
                // Strings.
                0x8c => {
                    let n = self.uint(1, "SHORT_BINUNICODE")?;
                    let v = self.string_arg(n, "a string")?;
                    self.push(v)?;
                }
                b'X' => {
                    let n = self.uint(4, "BINUNICODE")?;
                    let v = self.string_arg(n, "a string")?;
                    self.push(v)?;
                }
                0x8d => {
                    let n = self.uint(8, "BINUNICODE8")?;
                    let v = self.string_arg(n, "a string")?;
                    self.push(v)?;
                }
                b'U' => {
                    let n = self.uint(1, "SHORT_BINSTRING")?;
                    let v = self.string_arg(n, "a string")?;
                    self.push(v)?;
                }
                b'T' => {
                    let n = self.uint(4, "BINSTRING")?;
                    let v = self.string_arg(n, "a string")?;
                    self.push(v)?;
                }
                b'V' => {
                    let text = self.line("a UNICODE argument")?;
                    let s = raw_unicode_escape(&text)
                        .ok_or_else(|| self.bad("a UNICODE argument with a bad escape"))?;
                    let v = self.string(s.as_bytes());
                    self.push(v)?;
                }
                b'S' => {
                    let text = self.line("a STRING argument")?;
                    let s = python_string_literal(&text)
                        .ok_or_else(|| self.bad("a STRING argument that is not a quoted string"))?;
                    let v = self.string(&s);
                    self.push(v)?;
                }
                // Bytes.
                b'C' => {
                    let n = self.uint(1, "SHORT_BINBYTES")?;
                    self.skip_arg(n, "bytes")?;
                    self.push(Value::Bytes)?;
                }
                b'B' => {
                    let n = self.uint(4, "BINBYTES")?;
                    self.skip_arg(n, "bytes")?;
                    self.push(Value::Bytes)?;
                }
                0x8e | 0x96 => {
                    let n = self.uint(8, "BINBYTES8")?;
                    self.skip_arg(n, "bytes")?;
                    self.push(Value::Bytes)?;
                }
                // Containers.
                b']' => {
                    let v = self.new_list(Vec::new())?;
                    self.push(v)?;
                }
                b'}' => {
                    if let Some(list) = self.new_entry_list() {
                        if self.entry_lane_from_dict(&list)? {
                            continue;
                        }
                    }
                    let v = self.new_dict(Vec::new())?;
                    self.push(v)?;
                }
                b')' => {
                    let v = self.new_tuple(Vec::new())?;
                    self.push(v)?;
                }
                0x8f => {
                    // EMPTY_SET: a list will do (snapshots hold no sets).
                    let v = self.new_list(Vec::new())?;
                    self.push(v)?;
                }
                b'(' => {
                    if let Some(list) = self.lane_list() {
                        self.entry_lane(&list, false)?;
                        continue;
                    }
                    if self.marks.len() >= self.limits.max_marks {
                        return Err(self.bad(format!(
                            "more than {} MARKs are open at once: not a PyTorch memory snapshot",
                            self.limits.max_marks
                        )));
                    }
                    self.marks.push(self.stack.len());
                }
                b'l' => {
                    let items = self.pop_mark()?;
                    let v = self.new_list(items)?;
                    self.push(v)?;
                }
                0x91 => {
                    // FROZENSET
                    let items = self.pop_mark()?;
                    let v = self.new_list(items)?;
                    self.push(v)?;
                }
                b'd' => {
                    let items = self.pop_mark()?;
                    let v = self.new_dict(items)?;
                    self.push(v)?;
                }
                b't' => {
                    let items = self.pop_mark()?;
                    let v = self.new_tuple(items)?;
                    self.push(v)?;
                }
                0x85..=0x87 => {
                    let n = usize::from(op - 0x84);
                    if self.stack.len() < n + self.marks.last().copied().unwrap_or(0) {
                        return Err(self.bad("stack underflow"));
                    }
                    let items = self.stack.split_off(self.stack.len() - n);
                    let v = self.new_tuple(items)?;
                    self.push(v)?;
                }
                b'a' => {
                    let at = self.top_n(1)?;
                    self.insert_from(at)?;
                }
                b'e' | 0x90 => {
                    // APPENDS, ADDITEMS
                    let at = self
                        .marks
                        .pop()
                        .ok_or_else(|| self.bad("no MARK to pop to"))?;
                    self.insert_from(at)?;
                }
                b's' => {
                    let at = self.top_n(2)?;
                    self.insert_from(at)?;
                }
                b'u' => {
                    let at = self
                        .marks
                        .pop()
                        .ok_or_else(|| self.bad("no MARK to pop to"))?;
                    if !self.setitems_record(at)? {
                        self.insert_from(at)?;
                    }
                }
                // Stack manipulation.
                b'0' => drop(self.pop()?),
                b'1' => drop(self.pop_mark()?),
                b'2' => {
                    let v = self.top()?.clone();
                    self.push(v)?;
                }
                // Memo.
                0x94 => {
                    let key = self.memo_end() as u64;
                    self.memo_put(key)?;
                }
                b'q' => {
                    let key = self.uint(1, "BINPUT")?;
                    self.memo_put(key)?;
                }
                b'r' => {
                    let key = self.uint(4, "LONG_BINPUT")?;
                    self.memo_put(key)?;
                }
                b'p' => {
                    let text = self.line("a PUT argument")?;
                    let key = memo_key(&text)
                        .ok_or_else(|| self.bad("a PUT key that is not a number"))?;
                    self.memo_put(key)?;
                }
                b'h' => {
                    let key = self.uint(1, "BINGET")?;
                    self.memo_get(key)?;
                }
                b'j' => {
                    let key = self.uint(4, "LONG_BINGET")?;
                    self.memo_get(key)?;
                }
                b'g' => {
                    let text = self.line("a GET argument")?;
                    let key = memo_key(&text)
                        .ok_or_else(|| self.bad("a GET key that is not a number"))?;
                    self.memo_get(key)?;
                }
                // Objects: snapshots hold none, but C++-written pickles build lists
                // through `torch.jit._pickle.build_*list`.
                b'c' => {
                    let module = self.line("a GLOBAL module")?;
                    let name = self.line("a GLOBAL name")?;
                    let v = Value::Object(Rc::new(format!(
                        "{}.{}",
                        String::from_utf8_lossy(&module),
                        String::from_utf8_lossy(&name)
                    )));
                    self.push(v)?;
                }
                0x93 => {
                    let name = self.pop()?;
                    let module = self.pop()?;
                    let text = match (module.as_str(), name.as_str()) {
                        (Some(m), Some(n)) => format!("{m}.{n}"),
                        _ => return Err(self.bad("STACK_GLOBAL needs two strings")),
                    };
                    self.push(Value::Object(Rc::new(text)))?;
                }
                b'R' => {
                    let args = self.pop()?;
                    let callable = self.pop()?;
                    let v = self.reduce(callable, args)?;
                    self.push(v)?;
                }
                0x81 => {
                    // NEWOBJ
                    let _args = self.pop()?;
                    let class = self.pop()?;
                    self.push(object_of(&class))?;
                }
                0x92 => {
                    // NEWOBJ_EX
                    let _kwargs = self.pop()?;
                    let _args = self.pop()?;
                    let class = self.pop()?;
                    self.push(object_of(&class))?;
                }
                b'b' => {
                    // BUILD: the state goes into the object, which stays opaque.
                    self.pop()?;
                    self.top()?;
                }
                b'i' => {
                    let module = self.line("an INST module")?;
                    let name = self.line("an INST name")?;
                    self.pop_mark()?;
                    let v = Value::Object(Rc::new(format!(
                        "{}.{}",
                        String::from_utf8_lossy(&module),
                        String::from_utf8_lossy(&name)
                    )));
                    self.push(v)?;
                }
                b'o' => {
                    let mut items = self.pop_mark()?;
                    if items.is_empty() {
                        return Err(self.bad("OBJ without a class"));
                    }
                    let class = items.swap_remove(0);
                    self.push(object_of(&class))?;
                }
                0x82..=0x84 => {
                    let n = [1, 2, 4][usize::from(op - 0x82)];
                    let code = self.uint(n, "EXT")?;
                    self.push(Value::Object(Rc::new(format!("extension {code}"))))?;
                }
                b'P' => {
                    self.line("a PERSID argument")?;
                    self.push(Value::Object(Rc::new("persistent id".into())))?;
                }
                b'Q' => {
                    self.pop()?;
                    self.push(Value::Object(Rc::new("persistent id".into())))?;
                }
                0x97 | 0x98 => {
                    return Err(
                        self.bad("out-of-band buffers (pickle protocol 5) are not in snapshots")
                    )
                }
                _ => {
                    return Err(self.bad(format!("not a Python pickle (unknown opcode {op:#04x})")))
                }
            }
        }
    }

    /// Whether the EMPTY_DICT about to be run makes the next trace entry of a list
    /// whose entries can go straight into its records (as [`Machine::record_list`]
    /// says of a dict already made); returns that list.
    #[inline]
    fn new_entry_list(&self) -> Option<Rc<List>> {
        if !self.lane {
            return None;
        }
        let m = *self.marks.last()?;
        if m == 0 || (self.stack.len() > m && !matches!(self.stack.last(), Some(Value::Record))) {
            return None;
        }
        let Value::List(list) = &self.stack[m - 1] else {
            return None;
        };
        if list.sealed.get() || !matches!(&*list.items.borrow(), Items::Entries(_)) {
            return None;
        }
        Some(list.clone())
    }

    /// EMPTY_DICT, MEMOIZE, MARK of a trace entry that goes straight into `list`'s
    /// records: the entry lane runs from here without making the dict (it is made
    /// only if the lane hands over: [`Machine::leave_lane`]). Returns false, having
    /// read nothing, when the EMPTY_DICT is not followed by MEMOIZE and MARK.
    fn entry_lane_from_dict(&mut self, list: &List) -> Result<bool> {
        if (self.input.end - self.input.pos < 2 && !self.input.fill(2)?)
            || self.input.buf[self.input.pos..self.input.pos + 2] != [0x94, b'(']
        {
            return Ok(false);
        }
        self.count_container()?;
        self.input.pos += 2;
        self.entry_lane(list, true)?;
        Ok(true)
    }

    /// Whether the MARK about to be pushed opens the items of a trace entry the entry
    /// lane can read (see [`Machine::record_list`]); returns the entry's list.
    #[inline]
    fn lane_list(&self) -> Option<Rc<List>> {
        if !self.lane {
            return None;
        }
        let top = self.stack.len().checked_sub(1)?;
        self.record_list(top, self.marks.last().copied())
    }

    /// Whether `stack[at]` is a trace entry that can go straight into its list's
    /// records: a new, empty dict (its items not given yet) that is the next element
    /// of a list already holding trace entries (the list below `mark`, the batch's
    /// MARK), and every element of the batch before it went straight in too (so records
    /// stay in order). Returns that list.
    #[inline]
    fn record_list(&self, at: usize, mark: Option<usize>) -> Option<Rc<List>> {
        let Value::Dict(d) = self.stack.get(at)? else {
            return None;
        };
        let m = mark?;
        if m == 0 || m > at || d.sealed.get() || !d.items.borrow().is_empty() {
            return None;
        }
        if at > m && !matches!(self.stack[at - 1], Value::Record) {
            return None;
        }
        let Value::List(list) = &self.stack[m - 1] else {
            return None;
        };
        if list.sealed.get() || !matches!(&*list.items.borrow(), Items::Entries(_)) {
            return None;
        }
        Some(list.clone())
    }

    /// SETITEMS of `stack[at..]` into the dict at `at - 1`: when that is a trace entry
    /// that can go straight into its list ([`Machine::record_list`]), its items are
    /// read into a record there and the dict becomes a [`Value::Record`]. Returns
    /// whether it did.
    fn setitems_record(&mut self, at: usize) -> Result<bool> {
        let Some(dict_at) = at.checked_sub(1) else {
            return Ok(false);
        };
        let Some(list) = self.record_list(dict_at, self.marks.last().copied()) else {
            return Ok(false);
        };
        if (self.stack.len() - at) % 2 != 0 {
            return Ok(false);
        }
        let stack = if self.keep_frames {
            let frames = self.stack[at..]
                .chunks_exact(2)
                .rev()
                .find(|kv| kv[0].as_str() == Some("frames"))
                .map(|kv| kv[1].clone());
            self.frames_stack(frames)
        } else {
            Ok(None)
        };
        if let Items::Entries(store) = &mut *list.items.borrow_mut() {
            store.push_items(&self.stack[at..], stack);
        }
        self.stack.truncate(at);
        let dict = std::mem::replace(&mut self.stack[dict_at], Value::Record);
        self.release(&dict);
        self.recycle(dict);
        Ok(true)
    }

    /// The entry lane: reads the items of a trace entry (its MARK just read) straight
    /// from the input buffer into `list`'s records, without making values for them,
    /// the dict or the list's element: keys are known by their memo slot
    /// ([`Machine::lane_key`]) and values decoded into a [`RawEntry`] as they come.
    /// It takes the opcodes a snapshot's entries are made of (memo references, short
    /// strings and their MEMOIZE, ints, None and bools, FRAME) and an entry whose
    /// record [`EntryStore::push_lane`] can make at once; at anything else (another
    /// opcode, a value of the wrong kind, a key that is not a string, an entry that
    /// would be an error or is an `annotate`, the end of the buffered input) it hands
    /// over ([`Machine::leave_lane`]): the input goes back to the entry's first item,
    /// the memo to its length then, and the general machine reads the entry from
    /// there, with the same result (and the same error message). `new_dict`: the
    /// entry's dict is not made yet ([`Machine::entry_lane_from_dict`]); otherwise it
    /// is on top of the stack. Either way the stack ends with a [`Value::Record`] and
    /// the dict's memo slot holds [`Value::Consumed`], as a converted entry's.
    fn entry_lane(&mut self, list: &List, new_dict: bool) -> Result<()> {
        // The whole entry is read from the buffer as it is now (no refill inside),
        // so that handing over can go back to its start.
        if self.input.end - self.input.pos < LANE_WINDOW {
            self.input.fill(LANE_WINDOW)?;
        }
        let start = self.input.pos;
        // A safe point to let old memo slots go (none of the lane's are taken yet).
        self.memo_compact();
        let memo_len = self.memo_end();
        if new_dict {
            // The dict's slot (MEMOIZE): `Consumed` once it is a record.
            self.memo_push(Value::Consumed);
        }
        self.lane_mark = (self.frames.frame_count(), self.containers);
        let keep = self.keep_frames;
        let mut raw = RawEntry::default();
        let mut pos = start;
        // The key whose value comes next, if a key was read.
        let mut key: Option<LaneKey> = None;
        // What a MEMOIZE after the last item stores.
        let mut last: Option<Value> = None;
        // The entry's stack frames, when kept (a second `frames` key is handed over:
        // the general machine converts only the last).
        let mut stack = LaneStack::None;
        let mut frames_seen = false;
        // Whether it is the value of a key the lane does not read.
        let mut last_per_entry = false;
        loop {
            let end = self.input.end;
            if end - pos < LANE_LOOKAHEAD {
                return self.leave_lane(start, memo_len, new_dict);
            }
            let buf = &self.input.buf[pos..end];
            let op = buf[0];
            let (item, used) = match op {
                b'h' | b'j' => {
                    let (index, used) = if op == b'h' {
                        (usize::from(buf[1]), 2)
                    } else {
                        (
                            u32::from_le_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize,
                            5,
                        )
                    };
                    pos += used;
                    last = None;
                    match key.take() {
                        None => match self.lane_key(index) {
                            Some(k) => key = Some(k),
                            None => return self.leave_lane(start, memo_len, new_dict),
                        },
                        Some(LaneKey::Frames) if keep => {
                            // Stack frames shared with an earlier entry, or a value
                            // that is no list (no frames).
                            stack = match self.memo.get(index) {
                                Some(&Value::Stack(k)) if k != u32::MAX && !frames_seen => {
                                    LaneStack::Shared(k)
                                }
                                Some(Value::List(_) | Value::Stack(_)) | None => {
                                    return self.leave_lane(start, memo_len, new_dict)
                                }
                                Some(_) if !frames_seen => LaneStack::None,
                                Some(_) => return self.leave_lane(start, memo_len, new_dict),
                            };
                            frames_seen = true;
                        }
                        Some(k) => {
                            let ok = match self.memo_lookup(index) {
                                Some(v) => raw.set(k, v),
                                None => false,
                            };
                            if !ok {
                                return self.leave_lane(start, memo_len, new_dict);
                            }
                        }
                    }
                    continue;
                }
                b'K' => (Value::Int(i64::from(buf[1])), 2),
                b'M' => (
                    Value::Int(i64::from(u16::from_le_bytes([buf[1], buf[2]]))),
                    3,
                ),
                b'J' => (
                    Value::Int(i64::from(i32::from_le_bytes([
                        buf[1], buf[2], buf[3], buf[4],
                    ]))),
                    5,
                ),
                0x8a if buf[1] <= 8 => {
                    let n = usize::from(buf[1]);
                    let s = &buf[2..2 + n];
                    let v = match s.last() {
                        None => Value::Int(0),
                        Some(&high) => {
                            let mut b = if high & 0x80 != 0 { [0xff; 8] } else { [0; 8] };
                            b[..n].copy_from_slice(s);
                            let v = u64::from_le_bytes(b);
                            if n == 8 && high & 0x80 == 0 {
                                int_of_u64(v)
                            } else {
                                Value::Int(v as i64)
                            }
                        }
                    };
                    (v, 2 + n)
                }
                0x8c | b'X' => {
                    // SHORT_BINUNICODE, BINUNICODE
                    let (n, at) = if op == 0x8c {
                        (usize::from(buf[1]), 2)
                    } else {
                        (
                            u32::from_le_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize,
                            5,
                        )
                    };
                    if n > INTERN_MAX_LEN {
                        return self.leave_lane(start, memo_len, new_dict);
                    }
                    let mut short = [0u8; INTERN_MAX_LEN];
                    short[..n].copy_from_slice(&buf[at..at + n]);
                    (self.string(&short[..n]), at + n)
                }
                b'N' => (Value::None, 1),
                0x88 => (Value::Bool(true), 1),
                0x89 => (Value::Bool(false), 1),
                b']' if key == Some(LaneKey::Frames) && keep => {
                    // Stack frames kept: read into the stack buffer.
                    key = None;
                    last = None;
                    if frames_seen {
                        return self.leave_lane(start, memo_len, new_dict);
                    }
                    frames_seen = true;
                    match self.lane_stack(pos) {
                        Some((next, slot)) => {
                            pos = next;
                            stack = LaneStack::New(slot);
                        }
                        None => return self.leave_lane(start, memo_len, new_dict),
                    }
                    continue;
                }
                b')' if matches!(key, Some(LaneKey::Frames | LaneKey::Skip | LaneKey::Other)) => {
                    // An empty tuple where the lane keeps no value (this crate's
                    // snapshot writer gives entries without stack frames `frames: ()`):
                    // with frames kept, no frames. Memoized (Python's pickler never
                    // memoizes it), it is handed over: MEMOIZE finds no item.
                    if key.take() == Some(LaneKey::Frames) && keep {
                        if frames_seen {
                            return self.leave_lane(start, memo_len, new_dict);
                        }
                        frames_seen = true;
                        stack = LaneStack::None;
                    }
                    pos += 1;
                    last = None;
                    last_per_entry = false;
                    continue;
                }
                b']' | b'}'
                    if key == Some(LaneKey::Skip) || (key == Some(LaneKey::Frames) && !keep) =>
                {
                    // A container not kept (stack frames): run through.
                    key = None;
                    last = None;
                    match self.lane_skip(pos) {
                        Some(next) => pos = next,
                        None => return self.leave_lane(start, memo_len, new_dict),
                    }
                    continue;
                }
                0x94 => {
                    // MEMOIZE the item just read (not a memo reference's value).
                    let Some(v) = last.take() else {
                        return self.leave_lane(start, memo_len, new_dict);
                    };
                    self.memo_put_value(self.memo_end() as u64, v)?;
                    if std::mem::take(&mut last_per_entry) {
                        if let Some(f) = self.memo_used.last_mut() {
                            *f |= PER_ENTRY;
                        }
                    }
                    pos += 1;
                    continue;
                }
                0x95 => {
                    // FRAME
                    pos += 9;
                    continue;
                }
                b'u' if key.is_none() => {
                    let found = match stack {
                        LaneStack::New(_) => Some(self.frames.find_stack(&self.stack_buf)),
                        _ => None,
                    };
                    let index = match (stack, found) {
                        (LaneStack::Shared(k), _) => Some(k),
                        (_, Some(found)) => Some(found.index),
                        _ => None,
                    };
                    let pushed = match &mut *list.items.borrow_mut() {
                        Items::Entries(store) => store.push_lane(&raw, index),
                        _ => false,
                    };
                    if !pushed {
                        return self.leave_lane(start, memo_len, new_dict);
                    }
                    if let (LaneStack::New(slot), Some(found)) = (stack, found) {
                        let buf = std::mem::take(&mut self.stack_buf);
                        self.frames.commit_stack(&buf, found);
                        self.stack_buf = buf;
                        if let Some(slot) = slot {
                            self.memo[slot] = Value::Stack(found.index);
                        }
                    }
                    self.input.pos = pos + 1;
                    return self.lane_done(new_dict, memo_len);
                }
                _ => return self.leave_lane(start, memo_len, new_dict),
            };
            pos += used;
            last_per_entry = false;
            match key.take() {
                None => match &item {
                    Value::Str(s) => key = Some(LaneKey::of(s)),
                    // RawEntry ignores a key that is not a string: rare, handed over.
                    _ => return self.leave_lane(start, memo_len, new_dict),
                },
                Some(LaneKey::Frames) if keep => {
                    // Not a list: no frames.
                    if frames_seen {
                        return self.leave_lane(start, memo_len, new_dict);
                    }
                    frames_seen = true;
                    stack = LaneStack::None;
                }
                Some(k) => {
                    if !raw.set(k, &item) {
                        return self.leave_lane(start, memo_len, new_dict);
                    }
                    last_per_entry = k == LaneKey::Other;
                }
            }
            last = Some(item);
        }
    }

    /// The next opcode at `pos` for the entry lane, FRAME opcodes run through; `None`
    /// where fewer than [`LANE_LOOKAHEAD`] bytes are buffered.
    #[inline]
    fn lane_op(&self, pos: &mut usize) -> Option<u8> {
        loop {
            if self.input.end - *pos < LANE_LOOKAHEAD {
                return None;
            }
            let op = self.input.buf[*pos];
            if op != 0x95 {
                return Some(op);
            }
            *pos += 9;
        }
    }

    /// The memo index and length of the BINGET or LONG_BINGET at `pos` (with
    /// [`LANE_LOOKAHEAD`] bytes buffered).
    #[inline]
    fn lane_memo_ref(&self, pos: usize) -> (usize, usize) {
        let b = &self.input.buf[pos..];
        if b[0] == b'h' {
            (usize::from(b[1]), 2)
        } else {
            (u32::from_le_bytes([b[1], b[2], b[3], b[4]]) as usize, 5)
        }
    }

    /// The entry lane's stack frames (kept): the list from its EMPTY_LIST at `pos`, as
    /// Python's pickler writes it (MEMOIZE; then nothing, one frame and APPEND, or
    /// batches of frames between MARK and APPENDS), each frame a memo reference to a
    /// frame read before or a new frame dict ([`Machine::lane_frame`]), its frame
    /// indexes into [`Machine::stack_buf`]. Returns where the entry's next key (or its
    /// SETITEMS) starts and the list's memo slot (which holds a placeholder until the
    /// entry is kept: then its stack index), or `None` where the general machine must
    /// read the entry (anything else, a frame dict it does not take, a reference to
    /// something that is no frame).
    fn lane_stack(&mut self, mut pos: usize) -> Option<(usize, Option<usize>)> {
        self.count_container().ok()?;
        pos += 1;
        let mut slot = None;
        if self.lane_op(&mut pos)? == 0x94 {
            slot = Some(self.memo.len());
            self.memo_put_value(self.memo.len() as u64, Value::Stack(u32::MAX))
                .ok()?;
            pos += 1;
        }
        self.stack_buf.clear();
        // Inside a MARK; frames read outside one (waiting for APPEND).
        let mut open = false;
        let mut loose = 0;
        loop {
            if self.stack_buf.len() >= self.limits.max_stack {
                return None;
            }
            let op = self.lane_op(&mut pos)?;
            match op {
                b'(' if !open && loose == 0 => {
                    open = true;
                    pos += 1;
                }
                b'e' if open => {
                    open = false;
                    pos += 1;
                }
                b'a' if !open && loose == 1 => {
                    loose = 0;
                    pos += 1;
                }
                b'h' | b'j' => {
                    let (index, used) = self.lane_memo_ref(pos);
                    if !open {
                        // Outside a MARK a reference is the list's one frame only if
                        // APPEND follows; otherwise it is the entry's next key.
                        match self.input.buf[pos + used] {
                            b'a' if loose == 0 => loose = 1,
                            b'a' | 0x95 => return None,
                            _ if loose == 0 => return Some((pos, slot)),
                            _ => return None,
                        }
                    }
                    let frame = match self.memo.get(index) {
                        Some(&Value::Frame(k)) => k,
                        Some(Value::Dict(d)) => self.frames.frame_of_dict(d)?,
                        _ => return None,
                    };
                    self.stack_buf.push(frame);
                    pos += used;
                }
                b'}' => {
                    if !open {
                        if loose > 0 {
                            return None;
                        }
                        loose = 1;
                    }
                    let (next, frame) = self.lane_frame(pos)?;
                    self.stack_buf.push(frame);
                    pos = next;
                }
                _ if !open && loose == 0 => return Some((pos, slot)),
                _ => return None,
            }
        }
    }

    /// A new frame dict for the entry lane, from its EMPTY_DICT at `pos`: MEMOIZE,
    /// MARK, `filename`, `line` and `name` (in that order, as PyTorch and this crate's
    /// writer give them), SETITEMS; decoded into the frame table, its memo slot given
    /// the frame ([`Value::Frame`]). Returns where it ends and the frame's index, or
    /// `None` for any other shape (the general machine reads it, and says what is
    /// wrong with it, if anything).
    fn lane_frame(&mut self, mut pos: usize) -> Option<(usize, u32)> {
        self.count_container().ok()?;
        pos += 1;
        let mut slot = None;
        if self.lane_op(&mut pos)? == 0x94 {
            slot = Some(self.memo.len());
            self.memo_put_value(self.memo.len() as u64, Value::Consumed)
                .ok()?;
            pos += 1;
        }
        if self.lane_op(&mut pos)? != b'(' {
            return None;
        }
        pos += 1;
        let key = |m: &mut Self, pos: &mut usize, name: &str| -> Option<()> {
            let (next, k) = m.lane_str(*pos)?;
            *pos = next;
            (k.as_str() == name).then_some(())
        };
        key(self, &mut pos, "filename")?;
        let (next, filename) = self.lane_str(pos)?;
        pos = next;
        key(self, &mut pos, "line")?;
        let (next, line) = self.lane_line(pos)?;
        pos = next;
        key(self, &mut pos, "name")?;
        let (next, name) = self.lane_str(pos)?;
        pos = next;
        if self.lane_op(&mut pos)? != b'u' {
            return None;
        }
        let index = self.frames.push_frame(Frame {
            filename: filename.as_str().to_owned(),
            line,
            name: name.as_str().to_owned(),
        });
        if let Some(slot) = slot {
            self.memo[slot] = Value::Frame(index);
        }
        Some((pos + 1, index))
    }

    /// A string for the entry lane at `pos`: a memo reference to one, or a new one
    /// (memoized as itself if MEMOIZE follows). Returns where it ends.
    fn lane_str(&mut self, mut pos: usize) -> Option<(usize, Rc<String>)> {
        let op = self.lane_op(&mut pos)?;
        match op {
            b'h' | b'j' => {
                let (index, used) = self.lane_memo_ref(pos);
                match self.memo.get(index) {
                    Some(Value::Str(s)) => Some((pos + used, s.clone())),
                    _ => None,
                }
            }
            0x8c | b'X' => {
                let buf = &self.input.buf[pos..self.input.end];
                let (n, at) = if op == 0x8c {
                    (usize::from(buf[1]), 2)
                } else {
                    (
                        u32::from_le_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize,
                        5,
                    )
                };
                if n > buf.len() - at {
                    return None;
                }
                let s = if n <= INTERN_MAX_LEN {
                    let mut short = [0u8; INTERN_MAX_LEN];
                    short[..n].copy_from_slice(&buf[at..at + n]);
                    match self.string(&short[..n]) {
                        Value::Str(s) => s,
                        _ => return None,
                    }
                } else {
                    Rc::new(String::from_utf8_lossy(&buf[at..at + n]).into_owned())
                };
                pos += at + n;
                if self.lane_op(&mut pos)? == 0x94 {
                    self.memo_put_value(self.memo.len() as u64, Value::Str(s.clone()))
                        .ok()?;
                    pos += 1;
                }
                Some((pos, s))
            }
            _ => None,
        }
    }

    /// A frame's `line` for the entry lane at `pos`: an int in `[0, 2^63)`.
    fn lane_line(&mut self, mut pos: usize) -> Option<(usize, u64)> {
        let op = self.lane_op(&mut pos)?;
        let b = &self.input.buf[pos..];
        let (v, used) = match op {
            b'K' => (i64::from(b[1]), 2),
            b'M' => (i64::from(u16::from_le_bytes([b[1], b[2]])), 3),
            b'J' => (i64::from(i32::from_le_bytes([b[1], b[2], b[3], b[4]])), 5),
            0x8a if b[1] <= 8 => {
                let n = usize::from(b[1]);
                let s = &b[2..2 + n];
                let v = match s.last() {
                    None => 0,
                    Some(&high) => {
                        let mut v = if high & 0x80 != 0 { [0xff; 8] } else { [0; 8] };
                        v[..n].copy_from_slice(s);
                        i64::from_le_bytes(v)
                    }
                };
                (v, 2 + n)
            }
            _ => return None,
        };
        let v = u64::try_from(v).ok()?;
        Some((pos + used, v))
    }

    /// The entry lane's run through a container stored under a key whose containers
    /// are not kept (an entry's stack frames: a list of frame dicts, new or memo
    /// references), from its EMPTY_LIST or EMPTY_DICT at `pos`: what the general
    /// machine does there, for the opcodes such a value is made of, without its stack:
    /// containers made in it are [`Value::Skipped`], memo references in them are not
    /// looked up, strings are memoized as themselves. Returns where the entry's next
    /// key starts (or its SETITEMS), or `None` where the general machine must go on
    /// (anything else, or a shape it would refuse).
    fn lane_skip(&mut self, mut pos: usize) -> Option<usize> {
        let mut skip = std::mem::take(&mut self.skip);
        let mut marks = std::mem::take(&mut self.skip_marks);
        skip.clear();
        marks.clear();
        let out = self
            .lane_skip_in(&mut pos, &mut skip, &mut marks)
            .then_some(pos);
        self.skip = skip;
        self.skip_marks = marks;
        out
    }

    /// [`Machine::lane_skip`]'s loop over `skip`, its stack, and `marks`, its MARKs.
    fn lane_skip_in(
        &mut self,
        pos: &mut usize,
        skip: &mut Vec<Value>,
        marks: &mut Vec<usize>,
    ) -> bool {
        // Room the general machine would have for the MARKs and values.
        let max_marks = self.limits.max_marks.saturating_sub(self.marks.len() + 2);
        let max_values = self.limits.max_stack.saturating_sub(self.stack.len() + 256);
        // Whether `skip[at]` receives values as the general machine's skipped ones do.
        let skipped = |skip: &[Value], at: Option<usize>| {
            at.is_some_and(|at| matches!(skip.get(at), Some(Value::Skipped)))
        };
        loop {
            let end = self.input.end;
            if end - *pos < LANE_LOOKAHEAD || skip.len() > max_values {
                return false;
            }
            let buf = &self.input.buf[*pos..end];
            let op = buf[0];
            // The owner of the values pushed now: the container below the last MARK.
            let owner = marks.last().map(|&m| m.wrapping_sub(1));
            if marks.is_empty() {
                // At the entry's level only the skipped value itself, what is appended
                // to it and its MEMOIZE belong here; the next key ends it.
                match op {
                    b'(' | 0x94 | 0x95 => {}
                    b'a' | b's' if skip.len() >= 2 => {}
                    // The value itself, or an element for an APPEND (at a value's
                    // place among the entry's items, so the general machine skips it).
                    b']' | b'}' if skip.len() <= 1 => {}
                    _ if skip.len() == 1 => return true,
                    _ => return false,
                }
            }
            let item = match op {
                b']' | b'}' => {
                    // A container in a skipped one, or the skipped value's element
                    // (the general machine's `new_container_skipped`).
                    if !marks.is_empty() && !skipped(skip, owner) {
                        return false;
                    }
                    *pos += 1;
                    Value::Skipped
                }
                0x94 => {
                    let Some(v) = skip.last() else {
                        return false;
                    };
                    let v = v.clone();
                    if self.memo_put_value(self.memo_end() as u64, v).is_err() {
                        return false;
                    }
                    *pos += 1;
                    continue;
                }
                0x95 => {
                    *pos += 9;
                    continue;
                }
                b'(' => {
                    if marks.len() >= max_marks {
                        return false;
                    }
                    marks.push(skip.len());
                    *pos += 1;
                    continue;
                }
                b'e' | b'u' => {
                    // APPENDS, SETITEMS into a skipped container: the values go.
                    let Some(m) = marks.pop() else {
                        return false;
                    };
                    if !skipped(skip, m.checked_sub(1)) {
                        return false;
                    }
                    skip.truncate(m);
                    *pos += 1;
                    continue;
                }
                b'a' | b's' => {
                    let n = if op == b'a' { 1 } else { 2 };
                    let floor = marks.last().copied().unwrap_or(0);
                    let Some(at) = skip.len().checked_sub(n).filter(|&at| at >= floor) else {
                        return false;
                    };
                    if !skipped(skip, at.checked_sub(1)) {
                        return false;
                    }
                    skip.truncate(at);
                    *pos += 1;
                    continue;
                }
                b'h' | b'j' => {
                    // In a skipped container's batch: not looked up.
                    if !skipped(skip, owner) {
                        return false;
                    }
                    *pos += if op == b'h' { 2 } else { 5 };
                    Value::Skipped
                }
                0x8c | b'X' => {
                    let (n, at) = if op == 0x8c {
                        (usize::from(buf[1]), 2)
                    } else {
                        (
                            u32::from_le_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize,
                            5,
                        )
                    };
                    if at + n > buf.len() {
                        return false;
                    }
                    let v = if n <= INTERN_MAX_LEN {
                        let mut short = [0u8; INTERN_MAX_LEN];
                        short[..n].copy_from_slice(&buf[at..at + n]);
                        self.string(&short[..n])
                    } else {
                        Value::Str(Rc::new(
                            String::from_utf8_lossy(&buf[at..at + n]).into_owned(),
                        ))
                    };
                    *pos += at + n;
                    v
                }
                b'K' => {
                    *pos += 2;
                    Value::Int(i64::from(buf[1]))
                }
                b'M' => {
                    *pos += 3;
                    Value::Int(i64::from(u16::from_le_bytes([buf[1], buf[2]])))
                }
                b'J' => {
                    *pos += 5;
                    Value::Int(i64::from(i32::from_le_bytes([
                        buf[1], buf[2], buf[3], buf[4],
                    ])))
                }
                b'N' => {
                    *pos += 1;
                    Value::None
                }
                _ => return false,
            };
            skip.push(item);
        }
    }

    /// The entry lane made the entry's record: the stack gets a [`Value::Record`] for
    /// it (replacing its dict, if made) and the dict's memo slot [`Value::Consumed`].
    fn lane_done(&mut self, new_dict: bool, memo_len: usize) -> Result<()> {
        if new_dict {
            debug_assert!(matches!(
                self.memo[memo_len - self.memo_base],
                Value::Consumed
            ));
            return self.push(Value::Record);
        }
        let Some(top) = self.stack.last_mut() else {
            return Err(self.bad("stack underflow"));
        };
        let dict = std::mem::replace(top, Value::Record);
        self.release(&dict);
        self.recycle(dict);
        Ok(())
    }

    /// The kind of key in memo slot `index`, if it holds a string (cached by slot:
    /// keys are memoized once and referred to millions of times).
    #[inline]
    fn lane_key(&mut self, index: usize) -> Option<LaneKey> {
        let slot = self.key_cache[key_slot(index)];
        if slot.0 == index as u64 {
            return Some(slot.1);
        }
        let Some(Value::Str(s)) = self.memo_lookup(index) else {
            return None;
        };
        let k = LaneKey::of(s);
        self.key_cache[key_slot(index)] = (index as u64, k);
        Some(k)
    }

    /// Hands the entry over to the general machine: the input goes back to its first
    /// item and the memo to `memo_len` (what the lane memoized is memoized again by
    /// the general machine, under the same keys); the dict (made now if `new_dict`,
    /// in the memo slot MEMOIZE gave it) and the MARK go on the stack.
    #[cold]
    fn leave_lane(&mut self, start: usize, memo_len: usize, new_dict: bool) -> Result<()> {
        self.input.pos = start;
        self.memo.truncate(memo_len - self.memo_base);
        if !self.memo_used.is_empty() {
            self.memo_used.truncate(memo_len - self.memo_base);
        }
        self.key_cache.fill((u64::MAX, LaneKey::Other));
        // The frames the lane decoded are decoded again by the general machine.
        self.frames.truncate_frames(self.lane_mark.0);
        self.containers = self.lane_mark.1;
        if new_dict {
            let dict = self.dict_pool.pop().unwrap_or_else(|| {
                Rc::new(Dict {
                    items: RefCell::new(Vec::new()),
                    sealed: Cell::new(false),
                    depth: Cell::new(1),
                    memo: Cell::new(None),
                })
            });
            self.memo_put_value(memo_len as u64, Value::Dict(dict.clone()))?;
            self.push(Value::Dict(dict))?;
        }
        if self.marks.len() >= self.limits.max_marks {
            return Err(self.bad(format!(
                "more than {} MARKs are open at once: not a PyTorch memory snapshot",
                self.limits.max_marks
            )));
        }
        self.marks.push(self.stack.len());
        Ok(())
    }

    /// REDUCE: `torch.jit._pickle.build_*list(list)` gives the list back; anything
    /// else is an opaque object.
    fn reduce(&mut self, callable: Value, args: Value) -> Result<Value> {
        if let (Value::Object(name), Value::Tuple(args)) = (&callable, &args) {
            if name.starts_with("torch.jit._pickle.build_") && name.ends_with("list") {
                if let [list @ Value::List(_)] = &args.items[..] {
                    return Ok(list.clone());
                }
            }
        }
        Ok(object_of(&callable))
    }

    /// An integer from `n` little-endian two's-complement bytes.
    fn long_arg(&mut self, n: u64) -> Result<Value> {
        if n <= 8 {
            let s = self.input.take(n as usize, "a LONG")?;
            if s.is_empty() {
                return Ok(Value::Int(0));
            }
            let negative = s[s.len() - 1] & 0x80 != 0;
            let mut v: u64 = if negative { u64::MAX } else { 0 };
            for (i, &b) in s.iter().enumerate() {
                v &= !(0xffu64 << (8 * i));
                v |= u64::from(b) << (8 * i);
            }
            return Ok(Value::Int(v as i64));
        }
        let n_usize = self.arg_len(n, "a LONG")?;
        // Beyond 8 bytes only a non-negative value below 2^64 with zero padding fits.
        let mut fits = true;
        let mut low = 0u64;
        let mut read = 0usize;
        while read < n_usize {
            let k = (n_usize - read).min(BLOCK);
            let s = self.input.take(k, "a LONG")?;
            for (j, &b) in s.iter().enumerate() {
                let i = read + j;
                if i < 8 {
                    low |= u64::from(b) << (8 * i);
                } else if b != 0 {
                    fits = false;
                }
            }
            read += k;
        }
        Ok(if fits { int_of_u64(low) } else { Value::Huge })
    }

    /// A decimal integer argument (protocol 0), never converting more than 20 digits.
    fn decimal(&self, text: &[u8], what: &str) -> Result<Value> {
        let (negative, digits) = match text {
            [b'-', rest @ ..] => (true, rest),
            [b'+', rest @ ..] => (false, rest),
            _ => (false, text),
        };
        if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
            return Err(self.bad(format!("{what} argument that is not an integer")));
        }
        let digits = {
            let first = digits
                .iter()
                .position(|&d| d != b'0')
                .unwrap_or(digits.len());
            &digits[first..]
        };
        if digits.len() > 20 {
            return Ok(Value::Huge);
        }
        let mut v: u128 = 0;
        for &d in digits {
            v = v * 10 + u128::from(d - b'0');
        }
        Ok(if negative {
            match i64::try_from(-(v as i128)) {
                Ok(i) => Value::Int(i),
                Err(_) => Value::Huge,
            }
        } else {
            match u64::try_from(v) {
                Ok(u) => int_of_u64(u),
                Err(_) => Value::Huge,
            }
        })
    }
}

fn int_of_u64(u: u64) -> Value {
    match i64::try_from(u) {
        Ok(i) => Value::Int(i),
        Err(_) => Value::Big(u),
    }
}

fn object_of(class: &Value) -> Value {
    match class {
        Value::Object(name) => Value::Object(name.clone()),
        _ => Value::Object(Rc::new("object".into())),
    }
}

fn memo_key(text: &[u8]) -> Option<u64> {
    std::str::from_utf8(text).ok()?.trim().parse().ok()
}

/// Decodes Python's `raw-unicode-escape` (protocol 0 `UNICODE`): `\uXXXX` and
/// `\UXXXXXXXX` escapes, other bytes as Latin-1.
fn raw_unicode_escape(bytes: &[u8]) -> Option<String> {
    let mut out = String::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'\\' && i + 1 < bytes.len() && matches!(bytes[i + 1], b'u' | b'U') {
            let n = if bytes[i + 1] == b'u' { 4 } else { 8 };
            let hex = bytes.get(i + 2..i + 2 + n)?;
            let code = u32::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?;
            out.push(char::from_u32(code)?);
            i += 2 + n;
        } else {
            out.push(char::from(b));
            i += 1;
        }
    }
    Some(out)
}

/// Decodes a protocol 0 `STRING` argument: a quoted Python bytes literal.
fn python_string_literal(text: &[u8]) -> Option<Vec<u8>> {
    let q = *text.first()?;
    if !(q == b'\'' || q == b'"') || text.len() < 2 || *text.last()? != q {
        return None;
    }
    let body = &text[1..text.len() - 1];
    let mut out = Vec::with_capacity(body.len());
    let mut i = 0;
    while i < body.len() {
        if body[i] != b'\\' {
            out.push(body[i]);
            i += 1;
            continue;
        }
        let c = *body.get(i + 1)?;
        i += 2;
        match c {
            b'n' => out.push(b'\n'),
            b't' => out.push(b'\t'),
            b'r' => out.push(b'\r'),
            b'0'..=b'7' => {
                let mut v = u32::from(c - b'0');
                let mut k = 0;
                while k < 2 && i < body.len() && (b'0'..=b'7').contains(&body[i]) {
                    v = v * 8 + u32::from(body[i] - b'0');
                    i += 1;
                    k += 1;
                }
                out.push(v as u8);
            }
            b'x' => {
                let hex = body.get(i..i + 2)?;
                out.push(u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?);
                i += 2;
            }
            other => out.push(other),
        }
    }
    Some(out)
}

/// Reads a whole pickle.
/// Reads a whole pickle; returns its value and the stack frames kept.
pub(crate) fn read_value(
    reader: impl Read,
    limits: Limits,
    keep_frames: bool,
) -> Result<(Value, FrameTable)> {
    let mut machine = Machine::new(reader, limits, keep_frames);
    let value = machine.run()?;
    Ok((value, machine.frames))
}

/// Reads a whole pickle as [`read_value`] does (frames not kept), sending the
/// entries of each list of trace entries to the sink `sinks` makes for it instead of
/// keeping them (a streamed read: `snapshot::stream`).
pub(crate) fn read_value_streaming(
    reader: impl Read,
    limits: Limits,
    sinks: SinkFactory,
) -> Result<Value> {
    let mut machine = Machine::new(reader, limits, false);
    machine.sinks = Some(sinks);
    machine.run()
}

impl std::fmt::Debug for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.kind())
    }
}
