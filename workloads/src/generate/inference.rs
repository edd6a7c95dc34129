//! The `inference` generator: a model serving batches of requests, each a prefill of
//! the prompts and a decode of one token at a time, with a KV cache that grows and is
//! reallocated when it outgrows its capacity (`docs/generators.md`).
//!
//! Setup allocates the embedding (`vocab × hidden`), then each layer's parameters.
//! Each batch then:
//!
//! 1. marks `batch K` (K from 0) and draws the batch size, the prompt length and the
//!    number of tokens to decode, in that order (prompts are padded to one length);
//! 2. prefill, layer by layer: the layer's K and V caches (each `batch × kv_heads ×
//!    capacity × head_dim × dtype_bytes`, capacity = the prompt grown by the growth
//!    rule), then its activations (`batch × prompt × elements × dtype_bytes` each),
//!    freed in order; then the logits of the last position (`batch × vocab × 4`:
//!    float32), freed;
//! 3. decode, token by token: per layer, when the cache is full, a new K then V of
//!    the grown capacity, each followed by the free of the old one (a copy and a
//!    rebind); then the activations of one position, freed; then the logits, freed;
//! 4. the caches are freed, layer by layer (K, then V).
//!
//! Growth: `exact` grows the capacity to the length (a reallocation per token, as
//! `torch.cat` does), `block: N` to the next multiple of N tokens, `double` to twice
//! the capacity (at least the length). After the last batch, unless `leave_live`,
//! the parameters are freed.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::dist::{Dist, DistKind};
use super::emit::{bytes, Emitter, Phases, Scratch};
use crate::trace::Event;

/// How a KV cache grows when it is full.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Growth {
    /// To the length: a reallocation per token (`torch.cat`).
    Exact,
    /// To the next multiple of this many tokens (at least 1).
    Block(u64),
    /// To twice the capacity, at least the length.
    Double,
}

impl Growth {
    fn capacity(self, current: u64, needed: u64) -> u64 {
        if needed <= current {
            return current;
        }
        match self {
            Growth::Exact => needed,
            Growth::Block(n) => needed.div_ceil(n).saturating_mul(n),
            Growth::Double => current.saturating_mul(2).max(needed),
        }
    }
}

/// Options of the inference generator (`generate: inference`). The defaults: seed 0,
/// 8 batches of uniform 1..=8 requests, prompts log-normal around 256 tokens (sigma
/// 0.5, 1..=2048), uniform 16..=128 tokens decoded, 2-byte elements, 8 layers of
/// hidden 1024 with params `[4×1024×1024, 3×1024×4096]`, activations
/// `[1024, 4096]` per token, 8 KV heads of 128, vocab 32000, exact growth.
#[derive(Clone, Debug, PartialEq)]
pub struct InferenceSpec {
    /// Seed of the random source; the trace is named `inference-seed<seed>`.
    pub seed: u64,
    /// Batches served.
    pub batches: u64,
    /// Requests per batch, drawn per batch.
    pub batch: Dist,
    /// Prompt tokens, drawn per batch.
    pub prompt_len: Dist,
    /// Tokens decoded, drawn per batch.
    pub output_len: Dist,
    /// Bytes per element of weights, caches and activations.
    pub dtype_bytes: u64,
    /// Layers.
    pub layers: u64,
    /// The model's width (embedding columns).
    pub hidden: u64,
    /// Each layer's parameter tensors, in elements.
    pub layer_params: Vec<u64>,
    /// The activations of a layer's pass, in elements per token.
    pub activations: Vec<u64>,
    /// Key/value heads.
    pub kv_heads: u64,
    /// Elements per head.
    pub head_dim: u64,
    /// Vocabulary size (embedding rows, logits).
    pub vocab: u64,
    /// How a cache grows.
    pub growth: Growth,
    /// Scratch bursts at each layer's pass.
    pub scratch: Option<Scratch>,
    /// Leave the parameters live at the end.
    pub leave_live: bool,
}

impl Default for InferenceSpec {
    fn default() -> Self {
        InferenceSpec {
            seed: 0,
            batches: 8,
            batch: Dist {
                kind: DistKind::Uniform { min: 1, max: 8 },
                min: 0,
                max: u64::MAX,
            },
            prompt_len: Dist {
                kind: DistKind::LogNormal {
                    median: 256.0,
                    sigma: 0.5,
                },
                min: 1,
                max: 2048,
            },
            output_len: Dist {
                kind: DistKind::Uniform { min: 16, max: 128 },
                min: 0,
                max: u64::MAX,
            },
            dtype_bytes: 2,
            layers: 8,
            hidden: 1024,
            layer_params: vec![4 * 1024 * 1024, 3 * 1024 * 4096],
            activations: vec![1024, 4096],
            kv_heads: 8,
            head_dim: 128,
            vocab: 32000,
            growth: Growth::Exact,
            scratch: None,
            leave_live: false,
        }
    }
}

impl InferenceSpec {
    /// Checks the options; the message names the key.
    ///
    /// # Errors
    /// Zero sizes or layers, a layer's tensor of 0 elements, a distribution's bad
    /// parameters.
    pub fn check(&self) -> Result<(), String> {
        for (key, v) in [
            ("dtype_bytes", self.dtype_bytes),
            ("layers", self.layers),
            ("hidden", self.hidden),
            ("kv_heads", self.kv_heads),
            ("head_dim", self.head_dim),
            ("vocab", self.vocab),
        ] {
            if v == 0 {
                return Err(format!("{key}: must be at least 1"));
            }
        }
        if self.layer_params.contains(&0) {
            return Err("layer_params: a tensor of 0 elements".into());
        }
        if self.activations.contains(&0) {
            return Err("activations: a tensor of 0 elements".into());
        }
        if self.growth == Growth::Block(0) {
            return Err("growth: block: must be at least 1 token".into());
        }
        self.batch.check().map_err(|e| format!("batch: {e}"))?;
        self.prompt_len
            .check()
            .map_err(|e| format!("prompt_len: {e}"))?;
        self.output_len
            .check()
            .map_err(|e| format!("output_len: {e}"))?;
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

    /// The events, generated one batch at a time as they are taken. The spec must have
    /// passed [`InferenceSpec::check`].
    pub fn events(&self) -> InferenceEvents<'_> {
        InferenceEvents {
            spec: self,
            rng: ChaCha8Rng::seed_from_u64(self.seed),
            out: Emitter::new(),
            params: Vec::new(),
        }
    }
}

/// The inference generator's events, an iterator that holds one batch's events at a
/// time.
pub struct InferenceEvents<'a> {
    spec: &'a InferenceSpec,
    rng: ChaCha8Rng,
    out: Emitter,
    params: Vec<u64>,
}

impl Iterator for InferenceEvents<'_> {
    type Item = Event;

    fn next(&mut self) -> Option<Event> {
        self.next_event()
    }
}

/// Setup, one phase per served batch, the end.
impl Phases for InferenceEvents<'_> {
    fn emitter(&mut self) -> &mut Emitter {
        &mut self.out
    }

    fn phase_count(&self) -> u64 {
        self.spec.batches
    }

    fn setup(&mut self) {
        let s = self.spec;
        let emb = self.out.alloc(bytes(s.vocab, s.hidden, s.dtype_bytes), 0);
        self.params.push(emb);
        for _ in 0..s.layers {
            for &p in &s.layer_params {
                let id = self.out.alloc(bytes(p, s.dtype_bytes, 1), 0);
                self.params.push(id);
            }
        }
    }

    fn phase(&mut self, k: u64) {
        let s = self.spec;
        self.out.mark(format!("batch {k}"));
        let batch = s.batch.sample(&mut self.rng).max(1);
        let prompt = s.prompt_len.sample(&mut self.rng).max(1);
        let decode = s.output_len.sample(&mut self.rng);
        let dt = s.dtype_bytes;
        // Bytes of one K (or V) cache per token of capacity.
        let per_token = bytes(batch, s.kv_heads, s.head_dim).saturating_mul(dt);
        let scratch = s.scratch.as_ref();
        let logits = bytes(batch, s.vocab, 4);

        // Prefill.
        let mut capacity = s.growth.capacity(0, prompt);
        let mut caches: Vec<(u64, u64)> = Vec::with_capacity(s.layers as usize);
        let tokens = batch.saturating_mul(prompt);
        for _ in 0..s.layers {
            let k_cache = self.out.alloc(per_token.saturating_mul(capacity), 0);
            let v_cache = self.out.alloc(per_token.saturating_mul(capacity), 0);
            caches.push((k_cache, v_cache));
            self.activations(tokens);
        }
        let l = self.out.alloc(logits, 0);
        self.out.free(l);

        // Decode.
        let out = &mut self.out;
        let mut length = prompt;
        for _ in 0..decode {
            length = length.saturating_add(1);
            let grown = s.growth.capacity(capacity, length);
            for cache in caches.iter_mut() {
                if grown > capacity {
                    let k_new = out.alloc(per_token.saturating_mul(grown), 0);
                    out.free(cache.0);
                    let v_new = out.alloc(per_token.saturating_mul(grown), 0);
                    out.free(cache.1);
                    *cache = (k_new, v_new);
                }
                for &a in &s.activations {
                    let id = out.alloc(bytes(batch, a, dt), 0);
                    out.free(id);
                }
                out.scratch_burst(scratch, &mut self.rng, 0);
            }
            capacity = grown;
            let l = out.alloc(logits, 0);
            out.free(l);
        }
        for (k_cache, v_cache) in caches {
            out.free(k_cache);
            out.free(v_cache);
        }
        out.drain_scratch();
    }

    fn finish(&mut self) {
        if self.spec.leave_live {
            return;
        }
        for p in self.params.drain(..) {
            self.out.free(p);
        }
    }
}

impl InferenceEvents<'_> {
    /// One layer's pass over `tokens` positions: its activations, a scratch burst, the
    /// activations freed in order.
    fn activations(&mut self, tokens: u64) {
        let s = self.spec;
        let ids: Vec<u64> = s
            .activations
            .iter()
            .map(|&a| self.out.alloc(bytes(tokens, a, s.dtype_bytes), 0))
            .collect();
        self.out.scratch_burst(s.scratch.as_ref(), &mut self.rng, 0);
        for id in ids {
            self.out.free(id);
        }
    }
}
