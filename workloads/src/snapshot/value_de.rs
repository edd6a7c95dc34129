//! `serde` over the pickle machine's values, so that the snapshot's records are
//! `#[derive(Deserialize)]` structs. Errors name the key they happened under
//! (`'size' is -7, ...`) and never echo input text unescaped.

use std::fmt;

use serde::de::{self, DeserializeSeed, Expected, MapAccess, SeqAccess, Unexpected, Visitor};

use super::pickle::{Items, Value};

/// A conversion error: one line, input text escaped.
#[derive(Debug)]
pub(crate) struct DeError(pub String);

impl fmt::Display for DeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DeError {}

/// What an unexpected value is, without its text.
fn describe(u: &Unexpected<'_>) -> String {
    match u {
        Unexpected::Bool(_) => "a bool".into(),
        Unexpected::Unsigned(n) => n.to_string(),
        Unexpected::Signed(n) => n.to_string(),
        Unexpected::Float(_) => "a float".into(),
        Unexpected::Char(_) | Unexpected::Str(_) => "a string".into(),
        Unexpected::Bytes(_) => "bytes".into(),
        Unexpected::Unit | Unexpected::Option => "None".into(),
        Unexpected::Seq => "a list".into(),
        Unexpected::Map => "a dict".into(),
        other => escape(&other.to_string()),
    }
}

impl de::Error for DeError {
    fn custom<T: fmt::Display>(msg: T) -> DeError {
        DeError(escape(&msg.to_string()))
    }

    fn invalid_type(unexp: Unexpected<'_>, exp: &dyn Expected) -> DeError {
        DeError(format!("is {}, expected {exp}", describe(&unexp)))
    }

    fn invalid_value(unexp: Unexpected<'_>, exp: &dyn Expected) -> DeError {
        DeError(format!("is {}, expected {exp}", describe(&unexp)))
    }

    fn invalid_length(len: usize, exp: &dyn Expected) -> DeError {
        DeError(format!("has {len} elements, expected {exp}"))
    }

    fn missing_field(field: &'static str) -> DeError {
        DeError(format!("has no '{field}'"))
    }

    fn duplicate_field(field: &'static str) -> DeError {
        DeError(format!("has '{field}' twice"))
    }
}

/// Escapes control characters (terminal escape sequences among them) for messages.
pub(crate) fn escape(text: &str) -> String {
    if !text.chars().any(char::is_control) {
        return text.to_string();
    }
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_debug().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// Deserializes one value.
pub(crate) struct De<'a>(pub &'a Value);

impl<'de> de::Deserializer<'de> for De<'_> {
    type Error = DeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match self.0 {
            Value::None => visitor.visit_unit(),
            Value::Bool(b) => visitor.visit_bool(*b),
            Value::Int(i) => visitor.visit_i64(*i),
            Value::Big(u) => visitor.visit_u64(*u),
            Value::Huge => Err(DeError("is an integer that does not fit in 64 bits".into())),
            Value::Float(f) => visitor.visit_f64(*f),
            Value::Str(s) => visitor.visit_str(s),
            Value::Bytes => visitor.visit_bytes(&[]),
            Value::Tuple(t) => visitor.visit_seq(Seq {
                items: t.items.iter(),
                index: 0,
            }),
            Value::List(l) => match &*l.items.borrow() {
                Items::Values(items) => visitor.visit_seq(Seq {
                    items: items.iter(),
                    index: 0,
                }),
                Items::Entries(_) => Err(DeError("is a list of trace entries".into())),
                Items::Segments(_) => Err(DeError("is a list of segments".into())),
            },
            Value::Dict(d) => {
                let items = d.items.borrow();
                visitor.visit_map(Map {
                    items: items.chunks_exact(2),
                    value: None,
                    key: None,
                })
            }
            Value::Object(name) => Err(DeError(format!("is a Python object ({})", escape(name)))),
            Value::Skipped => visitor.visit_unit(),
            Value::Consumed => Err(DeError(
                "refers back to a trace entry or segment already read".into(),
            )),
            Value::Stack(_) => Err(DeError("refers back to stack frames already read".into())),
            Value::Frame(_) => Err(DeError("refers back to a stack frame already read".into())),
            Value::Record => Err(DeError("is a trace entry already read".into())),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match self.0 {
            Value::None => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, DeError> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        visitor.visit_unit()
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf unit unit_struct seq tuple
        tuple_struct map struct enum identifier
    }
}

struct Seq<'a> {
    items: std::slice::Iter<'a, Value>,
    index: usize,
}

impl<'de> SeqAccess<'de> for Seq<'_> {
    type Error = DeError;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, DeError> {
        match self.items.next() {
            Some(v) => {
                let index = self.index;
                self.index += 1;
                seed.deserialize(De(v))
                    .map(Some)
                    .map_err(|e| DeError(format!("[{index}] {}", e.0)))
            }
            None => Ok(None),
        }
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.items.len())
    }
}

struct Map<'a> {
    items: std::slice::ChunksExact<'a, Value>,
    value: Option<&'a Value>,
    key: Option<&'a Value>,
}

impl<'de> MapAccess<'de> for Map<'_> {
    type Error = DeError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, DeError> {
        match self.items.next() {
            Some([k, v]) => {
                self.key = Some(k);
                self.value = Some(v);
                seed.deserialize(De(k)).map(Some)
            }
            Some(_) => Err(DeError("a key without a value".into())),
            None => Ok(None),
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, DeError> {
        let value = self
            .value
            .take()
            .ok_or_else(|| DeError("a value without a key".into()))?;
        seed.deserialize(De(value))
            .map_err(|e| match self.key.and_then(Value::as_str) {
                Some(key) => DeError(format!("'{}' {}", escape(key), e.0)),
                None => e,
            })
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.items.len())
    }
}

/// Deserializes `T` from a value.
pub(crate) fn from_value<T: de::DeserializeOwned>(v: &Value) -> Result<T, DeError> {
    T::deserialize(De(v))
}
