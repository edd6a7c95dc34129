//! The option schema: what every policy's options type tells the registry so that a
//! specification `name:key=value,...` can be read into it, printed back, listed in help
//! and named in error messages, all from one description.
//!
//! A plain options type lists its options as [`Field`]s (name, meaning, kind, where the
//! value lives) and gets parsing, canonical printing and help from them. A type whose
//! options have a syntax of their own (the caching policy's, which are PyTorch's
//! `PYTORCH_CUDA_ALLOC_CONF` keys) implements [`PolicyOptions::parse`],
//! [`PolicyOptions::print`] and [`PolicyOptions::docs`] itself.
//!
//! Values are text here, converted by kind ([`OptionKind`]); sizes are read and written
//! by the `units` crate, the one place that knows `4KiB`.

use std::fmt::Debug;

use crate::caching::CachingDefaults;
use crate::policy::Policy;
use crate::registry::OptionsError;

/// One `key=value` of a specification, trimmed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Setting<'a> {
    /// The option's name.
    pub key: &'a str,
    /// Its value, as written.
    pub value: &'a str,
}

/// What an option's value is: decides how it is read, printed and shown in help.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OptionKind {
    /// A byte size: `512`, `4KiB`, `1.5GiB` (binary units); printed exactly (`4KiB`).
    Bytes,
    /// `true` or `false`.
    Bool,
    /// A decimal number, e.g. `0.5`.
    Float,
    /// Text in a syntax of its own, shown in help as the given placeholder (e.g. `MiB`
    /// or `True|False` for PyTorch's keys).
    Text(&'static str),
}

impl OptionKind {
    /// The placeholder help shows for a value: `SIZE`, `true|false`, `F`, or the text's.
    pub fn placeholder(self) -> &'static str {
        match self {
            OptionKind::Bytes => "SIZE",
            OptionKind::Bool => "true|false",
            OptionKind::Float => "F",
            OptionKind::Text(placeholder) => placeholder,
        }
    }
}

/// One option as help and error messages describe it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OptionDoc {
    /// The key, as written in a specification.
    pub name: &'static str,
    /// What its value is.
    pub kind: OptionKind,
    /// The default, written as the value would be (`512KiB`), or in words (`none`).
    pub default: String,
    /// What it means (one or two sentences).
    pub help: &'static str,
}

/// Where a [`Field`]'s value lives in its options type, by kind: a getter and a setter.
pub enum FieldValue<T> {
    /// A byte size.
    Bytes(fn(&T) -> u64, fn(&mut T, u64)),
    /// A flag.
    Bool(fn(&T) -> bool, fn(&mut T, bool)),
    /// A number (finite values print and read back exactly).
    Float(fn(&T) -> f64, fn(&mut T, f64)),
}

/// One option of a plain options type: everything parse, print and help need.
pub struct Field<T> {
    /// The key, as written in a specification.
    pub name: &'static str,
    /// What it means, for help (mention a default that depends on other options).
    pub help: &'static str,
    /// Its kind and where its value lives.
    pub value: FieldValue<T>,
}

impl<T> Field<T> {
    /// The kind of value the field takes.
    pub fn kind(&self) -> OptionKind {
        match self.value {
            FieldValue::Bytes(..) => OptionKind::Bytes,
            FieldValue::Bool(..) => OptionKind::Bool,
            FieldValue::Float(..) => OptionKind::Float,
        }
    }

    /// Reads `text` into the field of `target`.
    ///
    /// # Errors
    /// A [`FieldError`] naming the field and saying what is wrong with `text`.
    pub fn read(&self, target: &mut T, text: &str) -> Result<(), FieldError> {
        let name = self.name;
        match self.value {
            FieldValue::Bytes(_, set) => set(
                target,
                units::parse_size(text).map_err(|source| FieldError::Size { name, source })?,
            ),
            FieldValue::Bool(_, set) => set(
                target,
                match text {
                    "true" => true,
                    "false" => false,
                    _ => {
                        return Err(FieldError::NotABool {
                            name,
                            text: text.to_string(),
                        })
                    }
                },
            ),
            FieldValue::Float(_, set) => set(
                target,
                text.parse().map_err(|_| FieldError::NotANumber {
                    name,
                    text: text.to_string(),
                })?,
            ),
        }
        Ok(())
    }

    /// The field's value in `source`, written as [`Field::read`] reads it back.
    pub fn write(&self, source: &T) -> String {
        match self.value {
            FieldValue::Bytes(get, _) => units::format_size_exact(get(source)),
            FieldValue::Bool(get, _) => get(source).to_string(),
            FieldValue::Float(get, _) => get(source).to_string(),
        }
    }
}

/// A policy's options: its name, its options' description, how a specification's
/// settings are read into them and printed back, and how the policy is built.
///
/// Registering a type that implements this in [`crate::registry::POLICIES`] is all it
/// takes to enlist a policy in the command line (`--policies`, `allocsim policies`, error
/// messages) and in the conformance tests.
pub trait PolicyOptions: Clone + Debug + Default + PartialEq + Send + Sync + 'static {
    /// The policy's name in specifications (`buddy`).
    const NAME: &'static str;
    /// What the policy is, for help: a sentence or two.
    const ABOUT: &'static str;
    /// The options of a plain options type; parse, print and docs follow from them.
    /// Types that override all three leave it empty.
    const FIELDS: &'static [Field<Self>] = &[];

    /// Every option with its meaning and default, in help order.
    fn docs() -> Vec<OptionDoc> {
        let defaults = Self::default();
        Self::FIELDS
            .iter()
            .map(|f| OptionDoc {
                name: f.name,
                kind: f.kind(),
                default: f.write(&defaults),
                help: f.help,
            })
            .collect()
    }

    /// Reads a specification's settings, on top of the command line's defaults (which
    /// only the caching policy has). The last of repeated keys wins. Does not check
    /// that the options make a valid policy ([`PolicyOptions::validate`] does).
    ///
    /// # Errors
    /// An unknown key, a value that does not read, or a bad command-line default.
    fn parse(settings: &[Setting<'_>], defaults: &CachingDefaults) -> Result<Self, ParseError> {
        let _ = defaults;
        let mut options = Self::default();
        let mut given = Vec::new();
        for s in settings {
            let field = Self::FIELDS
                .iter()
                .find(|f| f.name == s.key)
                .ok_or_else(|| unknown_option::<Self>(s.key))?;
            field
                .read(&mut options, s.value)
                .map_err(|e| ParseError::Options(e.to_string()))?;
            given.push(field.name);
        }
        options.derive_defaults(&given);
        Ok(options)
    }

    /// Sets the options whose default depends on others, unless `given` names them.
    /// Called by the default [`PolicyOptions::parse`] after the settings are read.
    fn derive_defaults(&mut self, given: &[&str]) {
        let _ = given;
    }

    /// The canonical text of the options (empty for the defaults): the fewest settings,
    /// in [`PolicyOptions::FIELDS`] order, that [`PolicyOptions::parse`] reads back to
    /// equal options.
    fn print(&self) -> String {
        let all: Vec<(&str, String)> = Self::FIELDS
            .iter()
            .map(|f| (f.name, f.write(self)))
            .collect();
        let reads_back = |kept: &[(&str, String)]| {
            let settings: Vec<Setting<'_>> = kept
                .iter()
                .map(|(key, value)| Setting {
                    key,
                    value: value.as_str(),
                })
                .collect();
            Self::parse(&settings, &CachingDefaults::default()).as_ref() == Ok(self)
        };
        let mut kept = all;
        let mut i = 0;
        while i < kept.len() {
            let mut without = kept.clone();
            without.remove(i);
            if reads_back(&without) {
                kept = without;
            } else {
                i += 1;
            }
        }
        kept.iter()
            .map(|(key, value)| format!("{key}={value}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Settings of this policy that may avoid an out-of-memory of `cause` for a request
    /// of `requested_bytes`, most promising first, each with its text in specification
    /// syntax (`expandable_segments=True`); an explanation checks each by replaying.
    /// The default: none.
    fn remedies(
        &self,
        cause: crate::policy::OomCause,
        requested_bytes: u64,
    ) -> Vec<(String, Self)> {
        let _ = (cause, requested_bytes);
        Vec::new()
    }

    /// Checks that the options make a valid policy.
    ///
    /// # Errors
    /// What is inconsistent (e.g. a size that must be a power of two).
    fn validate(&self) -> Result<(), OptionsError> {
        Ok(())
    }

    /// The policy these options build.
    type Built: Policy + 'static;

    /// Builds the policy, as its own type (the registry boxes it as a `dyn Policy`, or
    /// hands it to a [`crate::registry::PolicyVisitor`] as it is).
    ///
    /// # Errors
    /// See [`PolicyOptions::validate`].
    fn build_policy(&self) -> Result<Self::Built, OptionsError>;

    /// Builds the policy behind a pointer.
    ///
    /// # Errors
    /// See [`PolicyOptions::validate`].
    fn build(&self) -> Result<Box<dyn Policy>, OptionsError> {
        Ok(Box::new(self.build_policy()?))
    }
}

/// A value that does not read into its field ([`Field::read`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FieldError {
    /// A size field's value is not a size.
    #[error("{name}: {source}")]
    Size {
        /// The field.
        name: &'static str,
        /// Why.
        #[source]
        source: units::SizeError,
    },
    /// A boolean field's value is neither `true` nor `false`.
    #[error("{name}: '{text}' is not true or false")]
    NotABool {
        /// The field.
        name: &'static str,
        /// The value.
        text: String,
    },
    /// A number field's value is not a number.
    #[error("{name}: '{text}' is not a number")]
    NotANumber {
        /// The field.
        name: &'static str,
        /// The value.
        text: String,
    },
}

/// Why a specification's settings do not read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// A command-line default is itself invalid (`--alloc-conf`).
    #[error("{flag} '{value}': {message}")]
    Default {
        /// The flag.
        flag: &'static str,
        /// Its value.
        value: String,
        /// What is wrong with it.
        message: String,
    },
    /// The specification's own settings: an unknown key or a bad value.
    #[error("{0}")]
    Options(String),
}

/// The error for a key `T` does not have, listing those it has.
pub fn unknown_option<T: PolicyOptions>(key: &str) -> ParseError {
    let names: Vec<&str> = T::docs().iter().map(|d| d.name).collect();
    ParseError::Options(if names.is_empty() {
        format!("unknown option '{key}' ({} has none)", T::NAME)
    } else {
        format!("unknown option '{key}' (known: {})", names.join(", "))
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// An options type with one field of each kind and a derived default, to test the
    /// schema apart from any policy.
    #[derive(Clone, Debug, PartialEq)]
    struct Sample {
        size: u64,
        half: u64,
        flag: bool,
        ratio: f64,
    }

    impl Default for Sample {
        fn default() -> Self {
            Sample {
                size: 1 << 20,
                half: 1 << 19,
                flag: false,
                ratio: 0.25,
            }
        }
    }

    impl PolicyOptions for Sample {
        const NAME: &'static str = "sample";
        const ABOUT: &'static str = "A test type.";
        const FIELDS: &'static [Field<Self>] = &[
            Field {
                name: "size",
                help: "a size",
                value: FieldValue::Bytes(|o| o.size, |o, v| o.size = v),
            },
            Field {
                name: "half",
                help: "default: half the size",
                value: FieldValue::Bytes(|o| o.half, |o, v| o.half = v),
            },
            Field {
                name: "flag",
                help: "a flag",
                value: FieldValue::Bool(|o| o.flag, |o, v| o.flag = v),
            },
            Field {
                name: "ratio",
                help: "a number",
                value: FieldValue::Float(|o| o.ratio, |o, v| o.ratio = v),
            },
        ];

        fn derive_defaults(&mut self, given: &[&str]) {
            if !given.contains(&"half") {
                self.half = self.size / 2;
            }
        }

        type Built = crate::immediate::ImmediatePolicy;

        fn build_policy(&self) -> Result<Self::Built, OptionsError> {
            Ok(crate::immediate::ImmediatePolicy::default())
        }
    }

    fn parse(text: &str) -> Result<Sample, ParseError> {
        let settings: Vec<Setting<'_>> = text
            .split(',')
            .filter(|s| !s.is_empty())
            .map(|s| {
                let (key, value) = s.split_once('=').unwrap();
                Setting { key, value }
            })
            .collect();
        Sample::parse(&settings, &CachingDefaults::default())
    }

    /// Each kind reads its syntax; the defaults print as nothing.
    #[test]
    fn kinds_read_their_syntax() {
        let o = parse("size=4KiB,flag=true,ratio=0.5").unwrap();
        assert_eq!(
            o,
            Sample {
                size: 4096,
                half: 2048,
                flag: true,
                ratio: 0.5
            }
        );
        assert_eq!(o.print(), "size=4KiB,flag=true,ratio=0.5");
        assert_eq!(Sample::default().print(), "");
    }

    /// A derived default is printed only where it differs from what it would derive.
    #[test]
    fn derived_default_prints_only_when_set_apart() {
        assert_eq!(parse("size=2MiB,half=1MiB").unwrap().print(), "size=2MiB");
        assert_eq!(
            parse("size=2MiB,half=4KiB").unwrap().print(),
            "size=2MiB,half=4KiB"
        );
        assert_eq!(parse("half=1MiB").unwrap().print(), "half=1MiB");
    }

    /// Unknown keys list the known ones; bad values name the key.
    #[test]
    fn errors_name_key_and_known_options() {
        assert_eq!(
            parse("colour=red").unwrap_err().to_string(),
            "unknown option 'colour' (known: size, half, flag, ratio)"
        );
        for (text, needle) in [
            ("size=huge", "size: 'huge' is not a size"),
            ("flag=yes", "flag: 'yes' is not true or false"),
            ("ratio=x", "ratio: 'x' is not a number"),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.starts_with(needle), "{text}: {e}");
        }
    }

    /// The docs give each field's kind and its default as written.
    #[test]
    fn docs_come_from_fields_and_default() {
        let docs = Sample::docs();
        let rows: Vec<(&str, OptionKind, &str)> = docs
            .iter()
            .map(|d| (d.name, d.kind, d.default.as_str()))
            .collect();
        assert_eq!(
            rows,
            [
                ("size", OptionKind::Bytes, "1MiB"),
                ("half", OptionKind::Bytes, "512KiB"),
                ("flag", OptionKind::Bool, "false"),
                ("ratio", OptionKind::Float, "0.25"),
            ]
        );
    }

    proptest! {
        /// Printing gives text that reads back to equal options, and is canonical:
        /// printing what was read gives the same text.
        #[test]
        fn print_round_trips(
            size in any::<u64>(),
            half in prop_oneof![Just(None), any::<u64>().prop_map(Some)],
            flag in any::<bool>(),
            ratio in -1e300f64..1e300,
        ) {
            let mut o = Sample { size, half: 0, flag, ratio };
            o.half = half.unwrap_or(size / 2);
            let text = o.print();
            let back = parse(&text).unwrap();
            prop_assert_eq!(&back, &o, "{}", text);
            prop_assert_eq!(back.print(), text);
        }
    }
}
