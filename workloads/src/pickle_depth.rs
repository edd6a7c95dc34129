//! How deeply a pickle nests, found without building it.
//!
//! serde-pickle builds (and drops) values recursively, so a crafted pickle nesting
//! containers some 10^5 levels deep would exhaust the stack: an abort, not an error.
//! [`max_nesting`] runs the pickle machine over the opcodes with nesting depths in place
//! of values (a scalar is 0, a container one more than its deepest element) and stops
//! at the first container deeper than a limit, so readers can refuse such files with a
//! message. It reads every opcode of protocols 0 to 5, skipping their arguments.

/// Why a pickle was refused before decoding.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum DepthError {
    /// Containers nest deeper than the limit.
    TooDeep {
        /// Byte offset of the opcode that went past it.
        offset: usize,
    },
    /// The bytes are not a well-formed pickle.
    Malformed {
        /// Byte offset of the problem.
        offset: usize,
        /// What is wrong.
        what: &'static str,
    },
}

/// Checks that no container nests deeper than `limit` levels.
///
/// # Errors
/// [`DepthError::TooDeep`] at the first container past the limit, or
/// [`DepthError::Malformed`] for bytes the pickle machine cannot run.
pub(crate) fn max_nesting(bytes: &[u8], limit: u32) -> Result<u32, DepthError> {
    let mut m = Machine {
        bytes,
        pos: 0,
        stack: Vec::new(),
        marks: Vec::new(),
        memo: std::collections::HashMap::new(),
        max: 0,
        limit,
    };
    m.run()?;
    Ok(m.max)
}

struct Machine<'a> {
    bytes: &'a [u8],
    pos: usize,
    /// Nesting depth of each value on the pickle machine's stack.
    stack: Vec<u32>,
    /// Stack lengths at each MARK.
    marks: Vec<usize>,
    memo: std::collections::HashMap<u64, u32>,
    max: u32,
    limit: u32,
}

impl Machine<'_> {
    fn malformed(&self, what: &'static str) -> DepthError {
        DepthError::Malformed {
            offset: self.pos,
            what,
        }
    }

    fn take(&mut self, n: usize) -> Result<&[u8], DepthError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or(DepthError::Malformed {
                offset: self.pos,
                what: "truncated argument",
            })?;
        let s = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn uint(&mut self, n: usize) -> Result<u64, DepthError> {
        let s = self.take(n)?;
        Ok(s.iter()
            .rev()
            .fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
    }

    /// Skips a newline-terminated text argument.
    fn line(&mut self) -> Result<(), DepthError> {
        match self.bytes[self.pos..].iter().position(|&b| b == b'\n') {
            Some(n) => {
                self.pos += n + 1;
                Ok(())
            }
            None => Err(self.malformed("unterminated text argument")),
        }
    }

    fn pop(&mut self) -> Result<u32, DepthError> {
        self.stack
            .pop()
            .ok_or_else(|| self.malformed("stack underflow"))
    }

    /// Pops everything down to the last MARK; returns the deepest.
    fn pop_mark(&mut self) -> Result<u32, DepthError> {
        let at = self.marks.pop().ok_or_else(|| self.malformed("no MARK"))?;
        if at > self.stack.len() {
            return Err(self.malformed("MARK above the stack"));
        }
        Ok(self.stack.drain(at..).max().unwrap_or(0))
    }

    fn push(&mut self, depth: u32, at: usize) -> Result<(), DepthError> {
        if depth > self.limit {
            return Err(DepthError::TooDeep { offset: at });
        }
        self.max = self.max.max(depth);
        self.stack.push(depth);
        Ok(())
    }

    /// A container on top of the stack receives an element of depth `inner`.
    fn grow_top(&mut self, inner: u32, at: usize) -> Result<(), DepthError> {
        let top = self.pop()?;
        self.push(top.max(inner + 1), at)
    }

    fn run(&mut self) -> Result<(), DepthError> {
        loop {
            let at = self.pos;
            let op = *self
                .bytes
                .get(self.pos)
                .ok_or_else(|| self.malformed("no STOP opcode"))?;
            self.pos += 1;
            match op {
                b'.' => return Ok(()),       // STOP
                0x80 => drop(self.take(1)?), // PROTO
                0x95 => drop(self.take(8)?), // FRAME
                // Scalars with fixed-size arguments.
                b'J' => {
                    self.take(4)?;
                    self.push(0, at)?;
                } // BININT
                b'K' => {
                    self.take(1)?;
                    self.push(0, at)?;
                } // BININT1
                b'M' => {
                    self.take(2)?;
                    self.push(0, at)?;
                } // BININT2
                b'G' => {
                    self.take(8)?;
                    self.push(0, at)?;
                } // BINFLOAT
                b'N' | 0x88 | 0x89 => self.push(0, at)?, // NONE, NEWTRUE, NEWFALSE
                // Scalars with a length prefix.
                0x8a | b'U' | 0x8c | b'C' => {
                    let n = self.uint(1)? as usize;
                    self.take(n)?;
                    self.push(0, at)?;
                }
                0x8b | b'T' | b'X' | b'B' => {
                    let n = self.uint(4)? as usize;
                    self.take(n)?;
                    self.push(0, at)?;
                }
                0x8d | 0x8e | 0x96 => {
                    let n = usize::try_from(self.uint(8)?)
                        .map_err(|_| self.malformed("length too large"))?;
                    self.take(n)?;
                    self.push(0, at)?;
                }
                // Text scalars (protocol 0).
                b'I' | b'L' | b'S' | b'V' | b'F' => {
                    self.line()?;
                    self.push(0, at)?;
                }
                // Empty containers.
                b']' | b')' | b'}' | 0x8f => self.push(1, at)?,
                b'(' => self.marks.push(self.stack.len()), // MARK
                b'a' => {
                    let v = self.pop()?;
                    self.grow_top(v, at)?;
                } // APPEND
                b's' => {
                    let v = self.pop()?;
                    let k = self.pop()?;
                    self.grow_top(v.max(k), at)?;
                } // SETITEM
                b'e' | b'u' | 0x90 => {
                    let inner = self.pop_mark()?;
                    self.grow_top(inner, at)?;
                } // APPENDS, SETITEMS, ADDITEMS
                b't' | b'l' | b'd' | 0x91 => {
                    let inner = self.pop_mark()?;
                    self.push(inner + 1, at)?;
                } // TUPLE, LIST, DICT, FROZENSET
                0x85..=0x87 => {
                    // TUPLE1..3
                    let mut inner = 0;
                    for _ in 0..(op - 0x84) {
                        inner = inner.max(self.pop()?);
                    }
                    self.push(inner + 1, at)?;
                }
                b'0' => drop(self.pop()?),      // POP
                b'1' => drop(self.pop_mark()?), // POP_MARK
                b'2' => {
                    let v = *self
                        .stack
                        .last()
                        .ok_or_else(|| self.malformed("stack underflow"))?;
                    self.push(v, at)?;
                } // DUP
                // Memo.
                0x94 => {
                    let v = *self
                        .stack
                        .last()
                        .ok_or_else(|| self.malformed("stack underflow"))?;
                    let k = self.memo.len() as u64;
                    self.memo.insert(k, v);
                } // MEMOIZE
                b'q' => {
                    let k = self.uint(1)?;
                    self.put(k)?;
                } // BINPUT
                b'r' => {
                    let k = self.uint(4)?;
                    self.put(k)?;
                } // LONG_BINPUT
                b'p' => {
                    let start = self.pos;
                    self.line()?;
                    let k = text_key(&self.bytes[start..self.pos]);
                    self.put(k)?;
                } // PUT
                b'h' => {
                    let k = self.uint(1)?;
                    self.get(k, at)?;
                } // BINGET
                b'j' => {
                    let k = self.uint(4)?;
                    self.get(k, at)?;
                } // LONG_BINGET
                b'g' => {
                    let start = self.pos;
                    self.line()?;
                    let k = text_key(&self.bytes[start..self.pos]);
                    self.get(k, at)?;
                } // GET
                // Objects (not in snapshots; decoding refuses them later), kept sound here.
                b'c' => {
                    self.line()?;
                    self.line()?;
                    self.push(0, at)?;
                } // GLOBAL
                0x93 => {
                    let a = self.pop()?;
                    let b = self.pop()?;
                    self.push(a.max(b), at)?;
                } // STACK_GLOBAL
                b'R' | 0x81 => {
                    let a = self.pop()?;
                    let b = self.pop()?;
                    self.push(a.max(b) + 1, at)?;
                } // REDUCE, NEWOBJ
                0x92 => {
                    let a = self.pop()?;
                    let b = self.pop()?;
                    let c = self.pop()?;
                    self.push(a.max(b).max(c) + 1, at)?;
                } // NEWOBJ_EX
                b'b' => {
                    let v = self.pop()?;
                    self.grow_top(v, at)?;
                } // BUILD
                b'i' => {
                    self.line()?;
                    self.line()?;
                    let inner = self.pop_mark()?;
                    self.push(inner + 1, at)?;
                } // INST
                b'o' => {
                    let inner = self.pop_mark()?;
                    self.push(inner + 1, at)?;
                } // OBJ
                0x82 => {
                    self.take(1)?;
                    self.push(0, at)?;
                } // EXT1
                0x83 => {
                    self.take(2)?;
                    self.push(0, at)?;
                } // EXT2
                0x84 => {
                    self.take(4)?;
                    self.push(0, at)?;
                } // EXT4
                b'P' => {
                    self.line()?;
                    self.push(0, at)?;
                } // PERSID
                b'Q' => {
                    let v = self.pop()?;
                    self.push(v, at)?;
                } // BINPERSID
                0x97 => self.push(0, at)?, // NEXT_BUFFER
                0x98 => {}                 // READONLY_BUFFER
                _ => {
                    return Err(DepthError::Malformed {
                        offset: at,
                        what: "unknown opcode",
                    })
                }
            }
        }
    }

    fn put(&mut self, key: u64) -> Result<(), DepthError> {
        let v = *self
            .stack
            .last()
            .ok_or_else(|| self.malformed("stack underflow"))?;
        self.memo.insert(key, v);
        Ok(())
    }

    fn get(&mut self, key: u64, at: usize) -> Result<(), DepthError> {
        let v = *self
            .memo
            .get(&key)
            .ok_or_else(|| self.malformed("memo key never stored"))?;
        self.push(v, at)
    }
}

/// A protocol-0 memo key (decimal text), as a number for the memo map.
fn text_key(line: &[u8]) -> u64 {
    line.iter()
        .take_while(|b| b.is_ascii_digit())
        .fold(0u64, |a, &b| {
            a.wrapping_mul(10).wrapping_add(u64::from(b - b'0'))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Nested lists as protocol 4 writes them: `EMPTY_LIST (MEMOIZE) ... APPEND`.
    fn nested_lists(depth: usize) -> Vec<u8> {
        let mut p = vec![0x80, 4];
        p.extend(std::iter::repeat_n(b']', depth));
        p.extend(std::iter::repeat_n(b'a', depth - 1));
        p.push(b'.');
        p
    }

    /// Depths come out as the containers nest; a deep one is refused where it goes past
    /// the limit, without recursion.
    #[test]
    fn measures_and_refuses_deep_nesting() {
        assert_eq!(max_nesting(&nested_lists(5), 256), Ok(5));
        // PROTO (2 bytes), 10^6 EMPTY_LISTs, then APPENDs: the k-th (from 0) makes depth
        // k + 2, so the one at k = 255 is the first past 256.
        assert_eq!(
            max_nesting(&nested_lists(1_000_000), 256),
            Err(DepthError::TooDeep {
                offset: 2 + 1_000_000 + 255
            })
        );
    }

    /// The real snapshot pickles nest a handful of levels.
    #[test]
    fn real_snapshots_are_shallow() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/torch");
        for f in ["seed002_retain.pickle", "multistream.pickle"] {
            let bytes = std::fs::read(dir.join(f)).unwrap();
            let depth = max_nesting(&bytes, 256).unwrap();
            assert!((3..=8).contains(&depth), "{f}: {depth}");
        }
    }

    /// Truncated or garbage bytes are malformed, not a panic.
    #[test]
    fn malformed_input() {
        assert!(matches!(
            max_nesting(b"", 256),
            Err(DepthError::Malformed { .. })
        ));
        assert!(matches!(
            max_nesting(&[0x80, 4, b'X', 0xff, 0xff], 256),
            Err(DepthError::Malformed { .. })
        ));
        assert!(matches!(
            max_nesting(b"a.", 256),
            Err(DepthError::Malformed { .. })
        ));
        assert!(matches!(
            max_nesting(&[0x80, 4, 0xfe], 256),
            Err(DepthError::Malformed { .. })
        ));
    }
}
