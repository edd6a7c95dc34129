//! The `training` generator: the allocations of a training loop, step by step, as
//! PyTorch makes them (`docs/generators.md` gives the algorithm and the spec's keys).
//!
//! Setup allocates every layer's parameters in order. Each step then:
//!
//! 1. marks `iteration K` (K from 0), draws the batch and then the sequence length,
//!    and allocates the input (`tokens × input × dtype_bytes`, on stream 1 when there
//!    are two streams or more: a copy stream); the previous step's input is freed
//!    after it (a Python variable rebound);
//! 2. forward, layer by layer: allocates the layer's activations
//!    (`tokens × elements × dtype_bytes` each, the last being its output), a scratch
//!    burst; a checkpointed layer frees all but its output at once;
//! 3. the loss (`dtype_bytes`), the gradient of the last output, the loss freed;
//! 4. backward, layers in reverse: a checkpointed layer allocates its dropped
//!    activations again (recomputation), a scratch burst, the gradient of each
//!    parameter not yet held, the gradient of its input (the previous layer's output;
//!    none for the first layer), then frees the gradient it received and its
//!    activations. With three streams or more, gradients are gathered in buckets
//!    of `bucket_bytes` in the order backward produces them, each bucket allocated on
//!    the next of streams `2..streams` as it fills (as DDP's all-reduce does); the
//!    last, partial bucket after the first layer;
//! 5. the optimizer: at the first step its state (`momentum`: one buffer per
//!    parameter, `adam`: two), in parameter order; `adam` then allocates one
//!    temporary per parameter (`foreach`: all, then frees them all in order;
//!    otherwise one at a time); `sgd` and `momentum` allocate nothing;
//! 6. the buckets are freed, then the gradients (`zero_grad(set_to_none=True)`)
//!    unless `keep_grads`, then what is left of the scratch.
//!
//! After the last step, unless `leave_live`, the input, gradients, optimizer state and
//! parameters are freed in that order.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::dist::Dist;
use super::emit::{bytes, Emitter, Phases, Scratch};
use crate::trace::Event;

/// A layer: its parameters and the activations its forward pass keeps for backward.
#[derive(Clone, Debug, PartialEq)]
pub struct Layer {
    /// Each parameter tensor's number of elements.
    pub params: Vec<u64>,
    /// Each activation's number of elements per token; the last is the layer's output
    /// (the next layer's input). At least one.
    pub activations: Vec<u64>,
    /// Activation checkpointing: keep only the output during forward, recompute the
    /// rest at backward.
    pub checkpoint: bool,
}

/// The optimizer, which decides the state kept per parameter and the temporaries of a
/// step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Optimizer {
    /// Plain SGD: no state.
    Sgd,
    /// SGD with momentum: one buffer per parameter.
    Momentum,
    /// Adam / AdamW: two moments per parameter, one temporary per parameter per step.
    Adam,
}

impl Optimizer {
    /// The names a spec uses, for messages.
    pub const NAMES: &'static str = "sgd, momentum, adam, adamw";

    /// Reads a name (`adamw` is `adam`: the same memory).
    pub fn parse(name: &str) -> Option<Optimizer> {
        match name {
            "sgd" => Some(Optimizer::Sgd),
            "momentum" => Some(Optimizer::Momentum),
            "adam" | "adamw" => Some(Optimizer::Adam),
            _ => None,
        }
    }

    fn states(self) -> usize {
        match self {
            Optimizer::Sgd => 0,
            Optimizer::Momentum => 1,
            Optimizer::Adam => 2,
        }
    }
}

/// Options of the training generator (`generate: training`). The defaults: seed 0,
/// 4 steps, batch 32, sequence length 1, 4-byte elements, input 1024 elements, three
/// layers of 1024×1024 weights with two activations of 1024, Adam with `foreach`,
/// gradients set to none, no checkpointing, one stream, 25 MiB buckets, no scratch.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainingSpec {
    /// Seed of the random source; the trace is named `training-seed<seed>`.
    pub seed: u64,
    /// Training steps.
    pub steps: u64,
    /// Samples per step, drawn per step.
    pub batch: Dist,
    /// Tokens per sample, drawn per step after the batch.
    pub seq_len: Dist,
    /// Bytes per element of every tensor.
    pub dtype_bytes: u64,
    /// Elements per token of the input batch.
    pub input: u64,
    /// The layers, in forward order.
    pub layers: Vec<Layer>,
    /// The optimizer.
    pub optimizer: Optimizer,
    /// Whether the optimizer's temporaries are allocated for all parameters at once.
    pub foreach: bool,
    /// Keep the gradients between steps (`zero_grad(set_to_none=False)`).
    pub keep_grads: bool,
    /// Streams: 1 computes; 2 adds a copy stream for the input; 3 or more add
    /// gradient buckets on streams `2..streams`.
    pub streams: u64,
    /// Bytes of a gradient bucket (three streams or more).
    pub bucket_bytes: u64,
    /// Scratch bursts at each layer's forward and backward.
    pub scratch: Option<Scratch>,
    /// Leave everything live at the end.
    pub leave_live: bool,
}

impl Default for TrainingSpec {
    fn default() -> Self {
        let layer = Layer {
            params: vec![1024 * 1024, 1024],
            activations: vec![1024, 1024],
            checkpoint: false,
        };
        TrainingSpec {
            seed: 0,
            steps: 4,
            batch: Dist::constant(32),
            seq_len: Dist::constant(1),
            dtype_bytes: 4,
            input: 1024,
            layers: vec![layer; 3],
            optimizer: Optimizer::Adam,
            foreach: true,
            keep_grads: false,
            streams: 1,
            bucket_bytes: 25 << 20,
            scratch: None,
            leave_live: false,
        }
    }
}

impl TrainingSpec {
    /// Checks the options; the message names the key.
    ///
    /// # Errors
    /// A value out of range: no layers, a layer without activations, zero sizes or
    /// streams, a distribution's bad parameters.
    pub fn check(&self) -> Result<(), String> {
        if self.layers.is_empty() {
            return Err("layers: at least one layer".into());
        }
        for (i, l) in self.layers.iter().enumerate() {
            if l.activations.is_empty() {
                return Err(format!(
                    "layers: layer {i}: activations: at least one (the output)"
                ));
            }
            if l.params.contains(&0) || l.activations.contains(&0) {
                return Err(format!("layers: layer {i}: a tensor of 0 elements"));
            }
        }
        for (key, v) in [
            ("dtype_bytes", self.dtype_bytes),
            ("input", self.input),
            ("streams", self.streams),
            ("bucket_bytes", self.bucket_bytes),
        ] {
            if v == 0 {
                return Err(format!("{key}: must be at least 1"));
            }
        }
        self.batch.check().map_err(|e| format!("batch: {e}"))?;
        self.seq_len.check().map_err(|e| format!("seq_len: {e}"))?;
        if let Some(s) = &self.scratch {
            s.count
                .check()
                .map_err(|e| format!("scratch: count: {e}"))?;
            s.bytes
                .check()
                .map_err(|e| format!("scratch: bytes: {e}"))?;
            s.lifetime
                .check()
                .map_err(|e| format!("scratch: lifetime: {e}"))?;
        }
        Ok(())
    }

    /// The events, generated one step at a time as they are taken. The spec must have
    /// passed [`TrainingSpec::check`].
    pub fn events(&self) -> TrainingEvents<'_> {
        TrainingEvents {
            spec: self,
            rng: ChaCha8Rng::seed_from_u64(self.seed),
            out: Emitter::new(),
            params: Vec::new(),
            state: Vec::new(),
            grads: Vec::new(),
            input: None,
        }
    }
}

/// The training generator's events, an iterator that holds one step's events at a time.
pub struct TrainingEvents<'a> {
    spec: &'a TrainingSpec,
    rng: ChaCha8Rng,
    out: Emitter,
    /// Each parameter's (id, bytes), in layer order.
    params: Vec<(u64, u64)>,
    /// The optimizer's state, in allocation order.
    state: Vec<u64>,
    /// Each parameter's gradient, when held.
    grads: Vec<Option<u64>>,
    /// The current input.
    input: Option<u64>,
}

impl Iterator for TrainingEvents<'_> {
    type Item = Event;

    fn next(&mut self) -> Option<Event> {
        self.next_event()
    }
}

/// Setup, one phase per training step, the end.
impl Phases for TrainingEvents<'_> {
    fn emitter(&mut self) -> &mut Emitter {
        &mut self.out
    }

    fn phase_count(&self) -> u64 {
        self.spec.steps
    }

    fn setup(&mut self) {
        let s = self.spec;
        for layer in &s.layers {
            for &p in &layer.params {
                let b = bytes(p, s.dtype_bytes, 1);
                let id = self.out.alloc(b, 0);
                self.params.push((id, b));
            }
        }
        self.grads = vec![None; self.params.len()];
    }

    fn phase(&mut self, k: u64) {
        let s = self.spec;
        let out = &mut self.out;
        out.mark(format!("iteration {k}"));
        let batch = s.batch.sample(&mut self.rng).max(1);
        let seq = s.seq_len.sample(&mut self.rng).max(1);
        let tokens = batch.saturating_mul(seq);
        let dt = s.dtype_bytes;
        let input_stream = u64::from(s.streams >= 2);
        let x = out.alloc(bytes(tokens, s.input, dt), input_stream);
        if let Some(prev) = self.input.replace(x) {
            out.free(prev);
        }
        let scratch = s.scratch.as_ref();

        // Forward: each layer's activations, ids per layer (None: dropped by
        // checkpointing until backward).
        let mut acts: Vec<Vec<Option<u64>>> = Vec::with_capacity(s.layers.len());
        for layer in &s.layers {
            let mut ids: Vec<Option<u64>> = layer
                .activations
                .iter()
                .map(|&a| Some(out.alloc(bytes(tokens, a, dt), 0)))
                .collect();
            out.scratch_burst(scratch, &mut self.rng, 0);
            if layer.checkpoint {
                let keep = ids.len() - 1;
                for id in ids[..keep].iter_mut() {
                    if let Some(id) = id.take() {
                        out.free(id);
                    }
                }
            }
            acts.push(ids);
        }

        // The loss and the gradient of the last output.
        let last = s
            .layers
            .last()
            .map_or(1, |l| l.activations[l.activations.len() - 1]);
        let loss = out.alloc(dt, 0);
        let mut grad = Some(out.alloc(bytes(tokens, last, dt), 0));
        out.free(loss);

        // Backward.
        let comm_streams = s.streams.saturating_sub(2);
        let mut bucket_fill = 0u64;
        let mut buckets: Vec<u64> = Vec::new();
        let mut param_index = self.params.len();
        for (l, layer) in s.layers.iter().enumerate().rev() {
            let ids = &mut acts[l];
            if layer.checkpoint {
                let n = ids.len() - 1;
                for (slot, &a) in ids[..n].iter_mut().zip(&layer.activations) {
                    *slot = Some(out.alloc(bytes(tokens, a, dt), 0));
                }
            }
            out.scratch_burst(scratch, &mut self.rng, 0);
            param_index -= layer.params.len();
            for i in param_index..param_index + layer.params.len() {
                let b = self.params[i].1;
                if self.grads[i].is_none() {
                    self.grads[i] = Some(out.alloc(b, 0));
                }
                if comm_streams > 0 {
                    bucket_fill = bucket_fill.saturating_add(b);
                    if bucket_fill >= s.bucket_bytes {
                        let stream = 2 + buckets.len() as u64 % comm_streams;
                        buckets.push(out.alloc(bucket_fill, stream));
                        bucket_fill = 0;
                    }
                }
            }
            let grad_in = (l > 0).then(|| {
                let prev = &s.layers[l - 1].activations;
                out.alloc(bytes(tokens, prev[prev.len() - 1], dt), 0)
            });
            if let Some(g) = grad.take() {
                out.free(g);
            }
            for id in ids.iter_mut().filter_map(Option::take) {
                out.free(id);
            }
            grad = grad_in;
        }
        if comm_streams > 0 && bucket_fill > 0 {
            let stream = 2 + buckets.len() as u64 % comm_streams;
            buckets.push(out.alloc(bucket_fill, stream));
        }

        // The optimizer.
        if k == 0 {
            for _ in 0..s.optimizer.states() {
                for &(_, b) in &self.params {
                    self.state.push(out.alloc(b, 0));
                }
            }
        }
        if s.optimizer == Optimizer::Adam {
            if s.foreach {
                let temps: Vec<u64> = self.params.iter().map(|&(_, b)| out.alloc(b, 0)).collect();
                for t in temps {
                    out.free(t);
                }
            } else {
                for &(_, b) in &self.params {
                    let t = out.alloc(b, 0);
                    out.free(t);
                }
            }
        }
        for b in buckets {
            out.free(b);
        }
        if !s.keep_grads {
            for g in self.grads.iter_mut().filter_map(Option::take) {
                out.free(g);
            }
        }
        out.drain_scratch();
    }

    fn finish(&mut self) {
        if self.spec.leave_live {
            return;
        }
        let out = &mut self.out;
        if let Some(x) = self.input.take() {
            out.free(x);
        }
        for g in self.grads.iter_mut().filter_map(Option::take) {
            out.free(g);
        }
        for s in self.state.drain(..) {
            out.free(s);
        }
        for (p, _) in self.params.drain(..) {
            out.free(p);
        }
    }
}
