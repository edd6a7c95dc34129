//! Generator specs: which generator, with which options, read from YAML with each
//! key's line (`docs/generators.md`). The one reader of generator options: a spec
//! file of `allocsim generate --spec`, the command line's `--set key=value` and
//! flags, and a sweep file's generated traces (`sim::sweep`) all go through
//! [`from_node`], so a generator's keys, defaults and checks are written once.

use std::io;
use std::path::Path;

use super::dist::{Dist, DistKind};
use super::emit::Scratch;
use super::inference::{Growth, InferenceSpec};
use super::training::{Layer, Optimizer, TrainingSpec};
use super::{random, InvalidOptions, RandomEvents, RandomOptions, SizeDistribution};
use crate::format::Format;
use crate::nodes::{self, Node, Value};
use crate::trace::{Event, Trace};

/// The generators, for messages.
pub const KINDS: &str = "random, training, inference";

/// A generator and its options.
#[derive(Clone, Debug, PartialEq)]
pub enum Generator {
    /// Random sizes and lifetimes ([`random`]).
    Random(RandomOptions),
    /// A training loop ([`TrainingSpec`]).
    Training(TrainingSpec),
    /// A model serving batches ([`InferenceSpec`]).
    Inference(InferenceSpec),
}

impl Generator {
    /// The generator's name: `random`, `training`, `inference`.
    pub fn kind(&self) -> &'static str {
        match self {
            Generator::Random(_) => "random",
            Generator::Training(_) => "training",
            Generator::Inference(_) => "inference",
        }
    }

    /// The seed.
    pub fn seed(&self) -> u64 {
        match self {
            Generator::Random(o) => o.seed,
            Generator::Training(s) => s.seed,
            Generator::Inference(s) => s.seed,
        }
    }

    /// The same generator with another seed.
    pub fn with_seed(&self, seed: u64) -> Generator {
        let mut g = self.clone();
        match &mut g {
            Generator::Random(o) => o.seed = seed,
            Generator::Training(s) => s.seed = seed,
            Generator::Inference(s) => s.seed = seed,
        }
        g
    }

    /// The trace's name: `<kind>-seed<seed>`.
    pub fn name(&self) -> String {
        format!("{}-seed{}", self.kind(), self.seed())
    }

    /// A name that tells generators with the same kind and seed apart: the random
    /// generator's options spelled out (`random-seed1-events1000-...`), another
    /// generator's name with a digest of its options (`training-seed1-3f2a...`,
    /// FNV-1a of their `Debug` text, the same on every platform).
    pub fn long_name(&self) -> String {
        match self {
            Generator::Random(o) => {
                let sizes = match o.sizes {
                    SizeDistribution::LogUniform {
                        min_bytes,
                        max_bytes,
                    } => format!(
                        "loguniform{}-{}",
                        units::format_size_exact(min_bytes),
                        units::format_size_exact(max_bytes)
                    ),
                    SizeDistribution::LogNormal {
                        median_bytes,
                        sigma,
                    } => format!(
                        "lognormal{}-sigma{sigma}",
                        units::format_size_exact(median_bytes)
                    ),
                };
                format!(
                    "random-seed{}-events{}-{sizes}-lifetime{}-streams{}{}{}",
                    o.seed,
                    o.events,
                    o.mean_lifetime_events,
                    o.streams,
                    o.mark_every.map_or(String::new(), |m| format!("-marks{m}")),
                    if o.free_at_end { "" } else { "-live" }
                )
            }
            other => {
                let text = format!("{other:?}");
                let digest = text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                    (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
                });
                format!("{}-{digest:016x}", other.name())
            }
        }
    }

    /// Checks the options.
    ///
    /// # Errors
    /// Options the generator cannot use: `the <kind> generator: <key>: <why>`.
    pub fn check(&self) -> Result<(), InvalidOptions> {
        let result = match self {
            Generator::Random(o) => random(&RandomOptions { events: 0, ..*o })
                .map(drop)
                .map_err(|e| e.0),
            Generator::Training(s) => s.check(),
            Generator::Inference(s) => s.check(),
        };
        result.map_err(|e| InvalidOptions(format!("the {} generator: {e}", self.kind())))
    }

    /// The events, made as they are asked for (one step of the random generator, one
    /// phase (a training step, a batch) of the structured ones), so a trace of any
    /// length can be written as it is made: memory follows what is live at once.
    ///
    /// # Errors
    /// As [`Generator::check`].
    pub fn events(&self) -> Result<Box<dyn Iterator<Item = Event> + '_>, InvalidOptions> {
        self.check()?;
        Ok(match self {
            Generator::Random(o) => Box::new(
                RandomEvents::new(o)
                    .map_err(|e| InvalidOptions(format!("the random generator: {e}")))?,
            ),
            Generator::Training(s) => Box::new(s.events()),
            Generator::Inference(s) => Box::new(s.events()),
        })
    }

    /// Whether the trace has at most `max_events` events: counted as they are made,
    /// without keeping them (at most `max_events + 1` are made).
    ///
    /// # Errors
    /// As [`Generator::check`].
    pub fn has_at_most(&self, max_events: u64) -> Result<bool, InvalidOptions> {
        let limit = usize::try_from(max_events).unwrap_or(usize::MAX);
        Ok(self.events()?.take(limit.saturating_add(1)).count() <= limit)
    }

    /// The whole trace, named [`Generator::name`].
    ///
    /// # Errors
    /// As [`Generator::check`], and a trace of more than `max_events` events.
    pub fn generate_at_most(&self, max_events: u64) -> Result<Trace, InvalidOptions> {
        let mut events = Vec::new();
        for e in self.events()? {
            if events.len() as u64 >= max_events {
                return Err(InvalidOptions(format!(
                    "the {} generator: the trace has more than {max_events} events",
                    self.kind()
                )));
            }
            events.push(e);
        }
        Ok(Trace::new(self.name(), events))
    }

    /// The whole trace, named [`Generator::name`].
    ///
    /// # Errors
    /// As [`Generator::check`].
    pub fn generate(&self) -> Result<Trace, InvalidOptions> {
        self.generate_at_most(u64::MAX)
    }

    /// Writes the trace, named [`Generator::name`], in `format` to `out`, each event
    /// as it is made: nothing is kept per event, so memory follows what is live at
    /// once, not the trace's length (`allocsim generate`). The bytes are those of
    /// [`crate::write()`] of [`Generator::generate`]'s trace. Returns how many events
    /// were written.
    ///
    /// # Errors
    /// As [`Generator::check`], and errors of `out` (then part of the trace may have
    /// been written).
    pub fn write(&self, format: Format, out: impl io::Write) -> Result<u64, WriteError> {
        let head = Trace::new(self.name(), Vec::new());
        Ok(crate::write_events(&head, self.events()?, format, out)?)
    }
}

/// Why [`Generator::write`] failed.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The options (nothing was written).
    #[error(transparent)]
    Invalid(#[from] InvalidOptions),
    /// Writing.
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// A spec that cannot be used: its line (0: the command line) and what is wrong,
/// starting with the key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeError {
    /// The line, 1-based; 0 for a value given on the command line.
    pub line: usize,
    /// What is wrong, starting with the key.
    pub message: String,
}

/// A generator spec that cannot be used: one line naming the file, the line and the
/// key (or the command line).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}", match (.path.as_deref(), .line) {
    (_, 0) | (None, _) => format!("on the command line: {}", .message),
    (Some(p), l) => format!("{p}: line {l}: {}", .message),
})]
pub struct SpecError {
    /// The spec file, when the error is in one.
    pub path: Option<String>,
    /// The line (0: a value from the command line).
    pub line: usize,
    /// What is wrong, starting with the key.
    pub message: String,
}

/// Reads a generator spec: the file's text (none: an empty spec), then the command
/// line's `key=value` settings (each value YAML, e.g. `batch={uniform: [8, 32]}`),
/// which replace the file's keys. `kind` is the generator named on the command line;
/// the spec's `generate` key must agree with it when both are given. Returns the
/// generator and the seeds the spec lists (`seed: [1, 2]`; the generator has the
/// first).
///
/// # Errors
/// One line naming the file, the line and the key: YAML that is not a spec, an unknown
/// key, a value the key does not take, options the generator cannot use.
pub fn read_spec(
    file: Option<(&str, &Path)>,
    kind: Option<&str>,
    settings: &[String],
) -> Result<(Generator, Vec<u64>), SpecError> {
    let path = file.map(|(_, p)| p.display().to_string());
    let at = |e: NodeError| SpecError {
        path: path.clone(),
        line: e.line,
        message: e.message,
    };
    let mut root = match file {
        Some((text, _)) => {
            nodes::parse(text).map_err(|(line, message)| at(NodeError { line, message }))?
        }
        None => Node {
            line: 1,
            value: Value::Map(Vec::new()),
        },
    };
    let Value::Map(entries) = &mut root.value else {
        return Err(at(NodeError {
            line: root.line,
            message: format!(
                "a generator spec is a mapping of keys (`generate: training`, `steps: 4`, ...), found {}",
                root.describe()
            ),
        }));
    };
    for setting in settings {
        let (key, value) = setting.split_once('=').ok_or_else(|| {
            at(NodeError {
                line: 0,
                message: format!("--set {setting}: expected KEY=VALUE"),
            })
        })?;
        let mut value = nodes::parse(value).map_err(|(_, m)| {
            at(NodeError {
                line: 0,
                message: format!("--set {setting}: {m}"),
            })
        })?;
        relocate(&mut value);
        let key = key.trim().to_string();
        entries.retain(|(k, _)| k.scalar() != Some(key.as_str()));
        entries.push((
            Node {
                line: 0,
                value: Value::Scalar {
                    text: key,
                    plain: true,
                },
            },
            value,
        ));
    }
    if let Some(kind) = kind {
        if let Some((k, v)) = entries.iter().find(|(k, _)| k.scalar() == Some("generate")) {
            if v.scalar() != Some(kind) {
                return Err(at(NodeError {
                    line: k.line,
                    message: format!(
                        "generate: the spec is for {}, the command line asks for {kind}",
                        v.describe()
                    ),
                }));
            }
        } else {
            entries.insert(
                0,
                (
                    Node {
                        line: 0,
                        value: Value::Scalar {
                            text: "generate".into(),
                            plain: true,
                        },
                    },
                    Node {
                        line: 0,
                        value: Value::Scalar {
                            text: kind.into(),
                            plain: true,
                        },
                    },
                ),
            );
        }
    }
    from_node(&root).map_err(at)
}

/// Gives a node from the command line, and its children, line 0.
fn relocate(node: &mut Node) {
    node.line = 0;
    match &mut node.value {
        Value::Scalar { .. } => {}
        Value::Seq(items) => items.iter_mut().for_each(relocate),
        Value::Map(entries) => entries.iter_mut().for_each(|(k, v)| {
            relocate(k);
            relocate(v);
        }),
    }
}

/// The keys of each generator, for messages.
const RANDOM_KEYS: &[&str] = &[
    "generate",
    "seed",
    "events",
    "sizes",
    "min_bytes",
    "max_bytes",
    "median_bytes",
    "sigma",
    "mean_lifetime",
    "streams",
    "mark_every",
    "leave_live",
];
const TRAINING_KEYS: &[&str] = &[
    "generate",
    "seed",
    "steps",
    "batch",
    "seq_len",
    "dtype_bytes",
    "input",
    "layers",
    "optimizer",
    "foreach",
    "keep_grads",
    "checkpoint",
    "streams",
    "bucket_bytes",
    "scratch",
    "leave_live",
];
const LAYER_KEYS: &[&str] = &["params", "activations", "checkpoint", "repeat"];
const INFERENCE_KEYS: &[&str] = &[
    "generate",
    "seed",
    "batches",
    "batch",
    "prompt_len",
    "output_len",
    "dtype_bytes",
    "layers",
    "hidden",
    "layer_params",
    "activations",
    "kv_heads",
    "head_dim",
    "vocab",
    "growth",
    "scratch",
    "leave_live",
];
const SCRATCH_KEYS: &[&str] = &["count", "bytes", "lifetime"];
const DIST_KEYS: &[&str] = &[
    "uniform",
    "normal",
    "lognormal",
    "poisson",
    "geometric",
    "min",
    "max",
];

/// The most layers a spec may expand to (`repeat`), and the most tensors a list may
/// hold: a few lines must not ask for memory out of proportion to them.
pub const MAX_LAYERS: u64 = 100_000;

/// Reads a generator from a spec's mapping (`generate: KIND` and its keys). Returns
/// the generator and the seeds listed (`seed: N` or `seed: [N, ...]`; default 0);
/// the generator has the first. Its options are checked ([`Generator::check`]).
///
/// # Errors
/// The line and the key: not a mapping, no or an unknown `generate`, an unknown key,
/// a value the key does not take, options the generator cannot use.
pub fn from_node(node: &Node) -> Result<(Generator, Vec<u64>), NodeError> {
    let Value::Map(entries) = &node.value else {
        return Err(err(
            node,
            format!(
                "a generator is a mapping (`{{generate: training, seed: 1}}`), found {}",
                node.describe()
            ),
        ));
    };
    let kind = match entries.iter().find(|(k, _)| k.scalar() == Some("generate")) {
        Some((_, v)) => (scalar("generate", v)?, v),
        None => {
            return Err(err(
                node,
                format!("generate: missing (which generator: {KINDS})"),
            ))
        }
    };
    let known = match kind.0 {
        "random" => RANDOM_KEYS,
        "training" => TRAINING_KEYS,
        "inference" => INFERENCE_KEYS,
        other => {
            return Err(err(
                kind.1,
                format!("generate: unknown generator '{other}' (known: {KINDS})"),
            ))
        }
    };
    let fields = Fields::new(entries, known, &format!("of the {} generator", kind.0))?;
    let seeds = match fields.get("seed") {
        Some(v) => {
            let seeds = items(v)
                .into_iter()
                .map(|s| uint("seed", s))
                .collect::<Result<Vec<_>, _>>()?;
            if seeds.is_empty() {
                return Err(err(v, "seed: no seeds given".into()));
            }
            seeds
        }
        None => vec![0],
    };
    let generator = match kind.0 {
        "random" => Generator::Random(random_options(&fields, seeds[0])?),
        "training" => Generator::Training(training(&fields, seeds[0])?),
        _ => Generator::Inference(inference(&fields, seeds[0])?),
    };
    generator.check().map_err(|e| err(node, e.0))?;
    Ok((generator, seeds))
}

fn random_options(f: &Fields<'_>, seed: u64) -> Result<RandomOptions, NodeError> {
    let mut o = RandomOptions {
        seed,
        ..RandomOptions::default()
    };
    if let Some(v) = f.get("events") {
        o.events = uint("events", v)?;
    }
    if let Some(v) = f.get("mean_lifetime") {
        o.mean_lifetime_events = float("mean_lifetime", v)?;
    }
    if let Some(v) = f.get("streams") {
        o.streams = uint("streams", v)?;
    }
    if let Some(v) = f.get("mark_every") {
        o.mark_every = Some(uint("mark_every", v)?);
    }
    if let Some(v) = f.get("leave_live") {
        o.free_at_end = !boolean("leave_live", v)?;
    }
    let opt_size = |key| f.get(key).map(|v| size(key, v)).transpose();
    let (min, max, median) = (
        opt_size("min_bytes")?,
        opt_size("max_bytes")?,
        opt_size("median_bytes")?,
    );
    let sigma = f.get("sigma").map(|v| float("sigma", v)).transpose()?;
    o.sizes = match f
        .get("sizes")
        .map(|v| Ok((scalar("sizes", v)?, v)))
        .transpose()?
    {
        None | Some(("log-uniform", _)) => SizeDistribution::LogUniform {
            min_bytes: min.unwrap_or(512),
            max_bytes: max.unwrap_or(256 << 20),
        },
        Some(("log-normal", _)) => SizeDistribution::LogNormal {
            median_bytes: median.unwrap_or(1 << 20),
            sigma: sigma.unwrap_or(2.0),
        },
        Some((other, v)) => {
            return Err(err(
                v,
                format!("sizes: unknown distribution '{other}' (known: log-uniform, log-normal)"),
            ))
        }
    };
    Ok(o)
}

fn training(f: &Fields<'_>, seed: u64) -> Result<TrainingSpec, NodeError> {
    let mut s = TrainingSpec {
        seed,
        ..TrainingSpec::default()
    };
    if let Some(v) = f.get("steps") {
        s.steps = uint("steps", v)?;
    }
    if let Some(v) = f.get("batch") {
        s.batch = dist("batch", v, false)?;
    }
    if let Some(v) = f.get("seq_len") {
        s.seq_len = dist("seq_len", v, false)?;
    }
    if let Some(v) = f.get("dtype_bytes") {
        s.dtype_bytes = uint("dtype_bytes", v)?;
    }
    if let Some(v) = f.get("input") {
        s.input = elements("input", v)?;
    }
    if let Some(v) = f.get("optimizer") {
        let name = scalar("optimizer", v)?;
        s.optimizer = Optimizer::parse(name).ok_or_else(|| {
            err(
                v,
                format!(
                    "optimizer: unknown optimizer '{name}' (known: {})",
                    Optimizer::NAMES
                ),
            )
        })?;
    }
    if let Some(v) = f.get("foreach") {
        s.foreach = boolean("foreach", v)?;
    }
    if let Some(v) = f.get("keep_grads") {
        s.keep_grads = boolean("keep_grads", v)?;
    }
    let checkpoint = f
        .get("checkpoint")
        .map(|v| boolean("checkpoint", v))
        .transpose()?;
    if let Some(v) = f.get("streams") {
        s.streams = uint("streams", v)?;
    }
    if let Some(v) = f.get("bucket_bytes") {
        s.bucket_bytes = size("bucket_bytes", v)?;
    }
    if let Some(v) = f.get("scratch") {
        s.scratch = Some(scratch(v)?);
    }
    if let Some(v) = f.get("leave_live") {
        s.leave_live = boolean("leave_live", v)?;
    }
    if let Some(v) = f.get("layers") {
        s.layers = layers(v, checkpoint.unwrap_or(false))?;
    } else if let Some(c) = checkpoint {
        s.layers.iter_mut().for_each(|l| l.checkpoint = c);
    }
    s.check().map_err(|e| err(f.line_of(&e), e))?;
    Ok(s)
}

fn layers(node: &Node, checkpoint: bool) -> Result<Vec<Layer>, NodeError> {
    let Value::Seq(list) = &node.value else {
        return Err(err(
            node,
            format!(
                "layers: a list of layers (`- {{params: [4096x4096, 4096], activations: [4096]}}`), found {}",
                node.describe()
            ),
        ));
    };
    let mut out = Vec::new();
    for (i, item) in list.iter().enumerate() {
        let key = format!("layers: {i}");
        let Value::Map(entries) = &item.value else {
            return Err(err(
                item,
                format!(
                    "{key}: a layer is a mapping with params and activations, found {}",
                    item.describe()
                ),
            ));
        };
        let f = Fields::new(entries, LAYER_KEYS, &format!("of {key}"))?;
        let params = match f.get("params") {
            Some(v) => element_list(&format!("{key}: params"), v)?,
            None => Vec::new(),
        };
        let Some(acts) = f.get("activations") else {
            return Err(err(
                item,
                format!("{key}: activations: missing (elements per token, the last the output)"),
            ));
        };
        let activations = element_list(&format!("{key}: activations"), acts)?;
        if activations.is_empty() {
            return Err(err(
                acts,
                format!("{key}: activations: at least one (the output)"),
            ));
        }
        let checkpoint = match f.get("checkpoint") {
            Some(v) => boolean(&format!("{key}: checkpoint"), v)?,
            None => checkpoint,
        };
        let repeat = match f.get("repeat") {
            Some(v) => uint(&format!("{key}: repeat"), v)?,
            None => 1,
        };
        if repeat == 0 || out.len() as u64 + repeat > MAX_LAYERS {
            let v = f.get("repeat").unwrap_or(item);
            return Err(err(
                v,
                format!("{key}: repeat: {repeat} makes no layer or more than {MAX_LAYERS} in all"),
            ));
        }
        let layer = Layer {
            params,
            activations,
            checkpoint,
        };
        out.extend(std::iter::repeat_n(layer, repeat as usize));
    }
    Ok(out)
}

fn inference(f: &Fields<'_>, seed: u64) -> Result<InferenceSpec, NodeError> {
    let mut s = InferenceSpec {
        seed,
        ..InferenceSpec::default()
    };
    if let Some(v) = f.get("batches") {
        s.batches = uint("batches", v)?;
    }
    if let Some(v) = f.get("batch") {
        s.batch = dist("batch", v, false)?;
    }
    if let Some(v) = f.get("prompt_len") {
        s.prompt_len = dist("prompt_len", v, false)?;
    }
    if let Some(v) = f.get("output_len") {
        s.output_len = dist("output_len", v, false)?;
    }
    for (key, slot) in [
        ("dtype_bytes", &mut s.dtype_bytes),
        ("layers", &mut s.layers),
        ("kv_heads", &mut s.kv_heads),
        ("head_dim", &mut s.head_dim),
        ("vocab", &mut s.vocab),
        ("hidden", &mut s.hidden),
    ] {
        if let Some(v) = f.get(key) {
            *slot = uint(key, v)?;
        }
    }
    if s.layers > MAX_LAYERS {
        return Err(err(
            f.get("layers").unwrap_or(f.node),
            format!("layers: at most {MAX_LAYERS}"),
        ));
    }
    if let Some(v) = f.get("layer_params") {
        s.layer_params = element_list("layer_params", v)?;
    }
    if let Some(v) = f.get("activations") {
        s.activations = element_list("activations", v)?;
    }
    if let Some(v) = f.get("growth") {
        s.growth = growth(v)?;
    }
    if let Some(v) = f.get("scratch") {
        s.scratch = Some(scratch(v)?);
    }
    if let Some(v) = f.get("leave_live") {
        s.leave_live = boolean("leave_live", v)?;
    }
    s.check().map_err(|e| err(f.line_of(&e), e))?;
    Ok(s)
}

fn growth(v: &Node) -> Result<Growth, NodeError> {
    let bad = || {
        err(
            v,
            format!(
                "growth: {} is not exact, double or {{block: TOKENS}}",
                v.describe()
            ),
        )
    };
    match &v.value {
        Value::Scalar { text, .. } => match text.as_str() {
            "exact" => Ok(Growth::Exact),
            "double" => Ok(Growth::Double),
            _ => Err(bad()),
        },
        Value::Map(entries) if entries.len() == 1 && entries[0].0.scalar() == Some("block") => {
            Ok(Growth::Block(uint("growth: block", &entries[0].1)?))
        }
        _ => Err(bad()),
    }
}

fn scratch(node: &Node) -> Result<Scratch, NodeError> {
    let Value::Map(entries) = &node.value else {
        return Err(err(
            node,
            format!(
                "scratch: a mapping of count, bytes and lifetime, found {}",
                node.describe()
            ),
        ));
    };
    let f = Fields::new(entries, SCRATCH_KEYS, "of scratch")?;
    let mut s = Scratch {
        count: Dist {
            kind: DistKind::Poisson { mean: 2.0 },
            min: 0,
            max: u64::MAX,
        },
        bytes: Dist {
            kind: DistKind::LogNormal {
                median: 65536.0,
                sigma: 1.5,
            },
            min: 1,
            max: u64::MAX,
        },
        lifetime: Dist {
            kind: DistKind::Geometric { mean: 4.0 },
            min: 1,
            max: u64::MAX,
        },
    };
    if let Some(v) = f.get("count") {
        s.count = dist("scratch: count", v, false)?;
    }
    if let Some(v) = f.get("bytes") {
        s.bytes = dist("scratch: bytes", v, true)?;
    }
    if let Some(v) = f.get("lifetime") {
        s.lifetime = dist("scratch: lifetime", v, false)?;
    }
    Ok(s)
}

/// A number or a distribution (see [`Dist`]); sizes (`4KiB`) where `bytes`.
fn dist(key: &str, node: &Node, bytes: bool) -> Result<Dist, NodeError> {
    let whole = |node: &Node| -> Result<u64, NodeError> {
        if bytes {
            size(key, node)
        } else {
            uint(key, node)
        }
    };
    let real = |node: &Node| -> Result<f64, NodeError> {
        if bytes {
            if let Some(Ok(b)) = node.scalar().map(units::parse_size) {
                return Ok(b as f64);
            }
        }
        float(key, node)
    };
    let entries = match &node.value {
        Value::Scalar { .. } => return Ok(Dist::constant(whole(node)?)),
        Value::Map(entries) => entries,
        Value::Seq(_) => {
            return Err(err(
                node,
                format!(
                    "{key}: a number or a distribution ({{uniform: [MIN, MAX]}}, {{normal: [MEAN, SD]}}, \
                     {{lognormal: [MEDIAN, SIGMA]}}, {{poisson: MEAN}}, {{geometric: MEAN}}), found a list"
                ),
            ))
        }
    };
    let f = Fields::new(entries, DIST_KEYS, &format!("of {key}"))?;
    let pair = |name: &str, v: &Node, first: &dyn Fn(&Node) -> Result<f64, NodeError>| {
        let Value::Seq(items) = &v.value else {
            return Err(err(
                v,
                format!("{key}: {name}: two numbers, found {}", v.describe()),
            ));
        };
        if items.len() != 2 {
            return Err(err(
                v,
                format!("{key}: {name}: two numbers, found {}", items.len()),
            ));
        }
        Ok((first(&items[0])?, float(key, &items[1])?))
    };
    let mut kinds = Vec::new();
    for (name, v) in &f.entries {
        let kind = match *name {
            "uniform" => {
                let Value::Seq(items) = &v.value else {
                    return Err(err(
                        v,
                        format!("{key}: uniform: [MIN, MAX], found {}", v.describe()),
                    ));
                };
                if items.len() != 2 {
                    return Err(err(
                        v,
                        format!("{key}: uniform: [MIN, MAX], found {} numbers", items.len()),
                    ));
                }
                DistKind::Uniform {
                    min: whole(&items[0])?,
                    max: whole(&items[1])?,
                }
            }
            "normal" => {
                let (mean, std_dev) = pair("normal", v, &real)?;
                DistKind::Normal { mean, std_dev }
            }
            "lognormal" => {
                let (median, sigma) = pair("lognormal", v, &real)?;
                DistKind::LogNormal { median, sigma }
            }
            "poisson" => DistKind::Poisson { mean: real(v)? },
            "geometric" => DistKind::Geometric { mean: real(v)? },
            _ => continue,
        };
        kinds.push((kind, *v));
    }
    let (kind, at) = match kinds.len() {
        1 => kinds.remove(0),
        0 => {
            return Err(err(
                node,
                format!("{key}: no distribution (uniform, normal, lognormal, poisson, geometric)"),
            ))
        }
        _ => return Err(err(kinds[1].1, format!("{key}: one distribution only"))),
    };
    let d = Dist {
        kind,
        min: f.get("min").map(whole).transpose()?.unwrap_or(0),
        max: f.get("max").map(whole).transpose()?.unwrap_or(u64::MAX),
    };
    d.check().map_err(|e| err(at, format!("{key}: {e}")))?;
    Ok(d)
}

/// A number of elements: `N` or a product `AxBx...` (`4096x8192`).
fn elements(key: &str, node: &Node) -> Result<u64, NodeError> {
    let text = scalar(key, node)?;
    let bad = || {
        err(
            node,
            format!("{key}: '{text}' is not a number of elements (N, or a shape AxB...)"),
        )
    };
    text.split(['x', 'X', '*'])
        .map(|d| d.trim().replace('_', "").parse::<u64>().map_err(|_| bad()))
        .try_fold(1u64, |acc, d| acc.checked_mul(d?).ok_or_else(bad))
}

fn element_list(key: &str, node: &Node) -> Result<Vec<u64>, NodeError> {
    let list = items(node);
    if list.len() as u64 > MAX_LAYERS {
        return Err(err(node, format!("{key}: more than {MAX_LAYERS} tensors")));
    }
    list.into_iter().map(|n| elements(key, n)).collect()
}

/// A mapping's entries by key, every key checked against the known ones.
struct Fields<'n> {
    node: &'n Node,
    entries: Vec<(&'n str, &'n Node)>,
}

impl<'n> Fields<'n> {
    fn new(entries: &'n [(Node, Node)], known: &[&str], of: &str) -> Result<Fields<'n>, NodeError> {
        let mut out = Vec::new();
        for (k, v) in entries {
            let key = k.scalar().unwrap_or_default();
            if !known.contains(&key) {
                return Err(err(
                    k,
                    format!("unknown key '{key}' {of} (known: {})", known.join(", ")),
                ));
            }
            out.push((key, v));
        }
        let node = entries.first().map_or(&EMPTY, |(k, _)| k);
        Ok(Fields { node, entries: out })
    }

    fn get(&self, key: &str) -> Option<&'n Node> {
        self.entries
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| *v)
    }

    /// The node a check's message is about: the value of the key it starts with, or
    /// the mapping's first key.
    fn line_of(&self, message: &str) -> &'n Node {
        let key = message.split(':').next().unwrap_or_default();
        self.get(key).unwrap_or(self.node)
    }
}

static EMPTY: Node = Node {
    line: 0,
    value: Value::Seq(Vec::new()),
};

fn err(node: &Node, message: String) -> NodeError {
    NodeError {
        line: node.line,
        message,
    }
}

/// The items of a list (a single scalar is a list of one).
fn items(node: &Node) -> Vec<&Node> {
    match &node.value {
        Value::Seq(items) => items.iter().collect(),
        _ => vec![node],
    }
}

fn scalar<'n>(key: &str, node: &'n Node) -> Result<&'n str, NodeError> {
    node.scalar().ok_or_else(|| {
        err(
            node,
            format!("{key}: expected a single value, found {}", node.describe()),
        )
    })
}

fn uint(key: &str, node: &Node) -> Result<u64, NodeError> {
    scalar(key, node)?.replace('_', "").parse().map_err(|_| {
        err(
            node,
            format!("{key}: {} is not a whole number", node.describe()),
        )
    })
}

fn float(key: &str, node: &Node) -> Result<f64, NodeError> {
    scalar(key, node)?
        .parse::<f64>()
        .ok()
        .filter(|f| f.is_finite())
        .ok_or_else(|| err(node, format!("{key}: {} is not a number", node.describe())))
}

fn size(key: &str, node: &Node) -> Result<u64, NodeError> {
    units::parse_size(scalar(key, node)?).map_err(|e| err(node, format!("{key}: {e}")))
}

fn boolean(key: &str, node: &Node) -> Result<bool, NodeError> {
    node.plain_bool().ok_or_else(|| {
        err(
            node,
            format!("{key}: {} is not true or false", node.describe()),
        )
    })
}

#[cfg(test)]
mod tests;
