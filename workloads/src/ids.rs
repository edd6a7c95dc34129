//! Named ids: an id in a YAML or CSV trace may be any token (`weights`, `kv_cache_3`,
//! `0x7f3a00000000`), not only a number. Readers intern names to dense integers, so a
//! replay sees plain [`AllocId`]s and its hot path does not change; the names stay
//! with the trace ([`Trace::id_names`](crate::Trace::id_names)) for writers and
//! messages, so a trace is written back as it was read.
//!
//! Rules:
//!
//! - A token of decimal digits is a number, compared by value (`007` is `7`), as in a
//!   trace of numbers; it must fit 64 bits.
//! - Any other token is a name, compared as written (case matters). A name is not
//!   empty, has no control characters (line breaks, tabs) and no space at either end.
//! - A trace whose ids are all numbers keeps them as they are (no table of names). As
//!   soon as one id is a name, every id of the trace is interned in order of first
//!   appearance (`0`, `1`, ...), a number under its decimal text.
//!
//! How a reader uses it: [`IdToken::parse`] each id, push the event with
//! [`IdTable::push`], and call [`IdTable::finish`] at the end.

use std::collections::HashMap;

use crate::trace::{AllocId, Event};

/// An id as written in a trace.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum IdToken {
    /// A decimal number.
    Number(u64),
    /// Any other token.
    Name(String),
}

impl IdToken {
    /// Reads a token: digits are a number, anything else a name (see the module docs).
    ///
    /// # Errors
    /// A message for an empty token, one with control characters or surrounding
    /// spaces, and digits that do not fit 64 bits.
    pub fn parse(text: &str) -> Result<IdToken, String> {
        if text.is_empty() {
            return Err("is empty".into());
        }
        if text.bytes().all(|b| b.is_ascii_digit()) {
            return text
                .parse()
                .map(IdToken::Number)
                .map_err(|_| "is a number too large for 64 bits".into());
        }
        if text.chars().any(char::is_control) {
            return Err("has a control character (a name is one line of text)".into());
        }
        if text.starts_with(char::is_whitespace) || text.ends_with(char::is_whitespace) {
            return Err("has a space at its start or end".into());
        }
        Ok(IdToken::Name(text.to_string()))
    }
}

/// The events of a trace being read, with their ids as written (see the module
/// docs): events whose id is a number carry it; those with a name carry a
/// placeholder until [`IdTable::finish`].
#[derive(Debug, Default)]
pub struct IdTable {
    /// (index of the event, its name) for each event whose id is a name.
    named: Vec<(usize, String)>,
}

impl IdTable {
    /// An empty table.
    pub fn new() -> IdTable {
        IdTable::default()
    }

    /// Pushes `event` (whose id, if it has one, is `token`; the id inside `event` is
    /// ignored) onto `events`.
    pub fn push(&mut self, events: &mut Vec<Event>, mut event: Event, token: Option<IdToken>) {
        match token {
            Some(IdToken::Number(n)) => set_id(&mut event, AllocId(n)),
            Some(IdToken::Name(name)) => {
                self.named.push((events.len(), name));
                set_id(&mut event, AllocId(0));
            }
            None => {}
        }
        events.push(event);
    }

    /// Gives every event its final id and returns the names
    /// ([`Trace::id_names`](crate::Trace::id_names)): empty when every id was a
    /// number, else every id interned in order of first appearance.
    pub fn finish(self, events: &mut [Event]) -> Vec<String> {
        if self.named.is_empty() {
            return Vec::new();
        }
        let mut named = self.named.into_iter().peekable();
        let mut dense: HashMap<IdToken, u64> = HashMap::new();
        let mut names: Vec<String> = Vec::new();
        for (index, event) in events.iter_mut().enumerate() {
            let Some(id) = event_id(event) else {
                continue;
            };
            let token = match named.next_if(|(i, _)| *i == index) {
                Some((_, name)) => IdToken::Name(name),
                None => IdToken::Number(id.0),
            };
            let next = names.len() as u64;
            let id = *dense.entry(token).or_insert_with_key(|token| {
                names.push(match token {
                    IdToken::Number(n) => n.to_string(),
                    IdToken::Name(s) => s.clone(),
                });
                next
            });
            set_id(event, AllocId(id));
        }
        names
    }
}

/// The id an event names, if any.
pub fn event_id(event: &Event) -> Option<AllocId> {
    match *event {
        Event::Alloc { id, .. } | Event::FreeRequested { id } | Event::Free { id } => Some(id),
        _ => None,
    }
}

/// Sets the id of an event that names one.
pub(crate) fn set_id(event: &mut Event, new: AllocId) {
    match event {
        Event::Alloc { id, .. } | Event::FreeRequested { id } | Event::Free { id } => *id = new,
        _ => {}
    }
}

/// Whether a name reads back as a number (a decimal token): writers write such ids
/// bare and quote every other name where the format needs it.
pub fn is_number(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_digit())
}

/// Hexadecimal digits (no prefix, no sign) as a number; `None` when empty, when any
/// character is not a hex digit, or when the value does not fit in 64 bits.
pub(crate) fn hex_u64(digits: &str) -> Option<u64> {
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(digits, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc(id: u64) -> Event {
        Event::Alloc {
            id: AllocId(id),
            size_bytes: 8,
            stream: 0,
        }
    }

    /// Tokens: digits are numbers by value, anything else a name; empty tokens, control
    /// characters, surrounding spaces and numbers past 64 bits are refused.
    #[test]
    fn tokens() {
        assert_eq!(IdToken::parse("007"), Ok(IdToken::Number(7)));
        assert_eq!(
            IdToken::parse("0x7f3a00000000"),
            Ok(IdToken::Name("0x7f3a00000000".into()))
        );
        assert_eq!(
            IdToken::parse("kv cache 3"),
            Ok(IdToken::Name("kv cache 3".into()))
        );
        assert_eq!(IdToken::parse("-4"), Ok(IdToken::Name("-4".into())));
        assert!(IdToken::parse("").unwrap_err().contains("empty"));
        assert!(IdToken::parse("a\nb").unwrap_err().contains("control"));
        assert!(IdToken::parse(" a").unwrap_err().contains("space"));
        assert!(IdToken::parse("99999999999999999999")
            .unwrap_err()
            .contains("64 bits"));
    }

    /// Numbers alone stay as written, with no table; one name interns every id in
    /// order of first appearance, numbers under their decimal text, and the same
    /// token always gets the same id.
    #[test]
    fn interning() {
        let mut t = IdTable::new();
        let mut events = Vec::new();
        t.push(&mut events, alloc(0), Some(IdToken::Number(40)));
        t.push(&mut events, Event::EmptyCache, None);
        t.push(
            &mut events,
            Event::Free { id: AllocId(0) },
            Some(IdToken::Number(40)),
        );
        assert!(t.finish(&mut events).is_empty());
        assert_eq!(events[0], alloc(40));

        let mut t = IdTable::new();
        let mut events = Vec::new();
        t.push(&mut events, alloc(0), Some(IdToken::Number(40)));
        t.push(&mut events, alloc(0), Some(IdToken::Name("weights".into())));
        t.push(
            &mut events,
            Event::Free { id: AllocId(0) },
            Some(IdToken::Number(40)),
        );
        t.push(&mut events, Event::Mark { label: "x".into() }, None);
        t.push(
            &mut events,
            Event::Free { id: AllocId(0) },
            Some(IdToken::Name("weights".into())),
        );
        assert_eq!(t.finish(&mut events), ["40", "weights"]);
        assert_eq!(
            events,
            [
                alloc(0),
                alloc(1),
                Event::Free { id: AllocId(0) },
                Event::Mark { label: "x".into() },
                Event::Free { id: AllocId(1) },
            ]
        );
    }
}
