//! Why a replay's numbers are not exact: what the trace's reader found
//! ([`workloads::TraceMeta::caveats`]), calls the policy ignored, blocks of a checkpoint
//! restore it could not place where the recording had them, and settings the policy
//! does not model. `replay`, `compare` and `fidelity` print them as warnings.

use policies::caching::CachingConfig;
use policies::PolicyConfig;
use workloads::Trace;

use crate::Replay;

/// Every reason the replay of `trace` under `config` (which gave `replay`) is not exact,
/// each a sentence; empty when nothing is known to be off.
pub fn caveats(trace: &Trace, config: &PolicyConfig, replay: &Replay) -> Vec<String> {
    let mut out = trace.meta.caveats.clone();
    if replay.ignored_call_count > 0 {
        let pools = trace.pools();
        let pools = if pools.is_empty() {
            String::new()
        } else {
            let names: Vec<String> = pools.iter().map(ToString::to_string).collect();
            format!(" (private pools {})", names.join(", "))
        };
        out.push(format!(
            "{}: the policy does not model PyTorch's private pools and allocator calls and ignored {} of the trace's{pools}; \
             its numbers serve every request from one heap",
            config.kind_name(),
            replay.ignored_call_count
        ));
    }
    if replay.missed_restore_count > 0 {
        out.push(format!(
            "{}: {} block(s) of a private pool set back to a checkpoint (torch.compile's CUDA graph trees) were not \
             where the recording had them (the trace carries no recorded segment addresses, as a CSV does not, or \
             the replay's pool differs there: another configuration, or a replay that went another way before); \
             those requests were served by the policy's own choice, so the pool \
             can differ from PyTorch's from there on",
            config.kind_name(),
            replay.missed_restore_count
        ));
    }
    let short_of_start = replay.oom.as_ref().filter(|o| o.before_first_event());
    if let (true, Some(_)) = (replay.started_by_allocating > 0, short_of_start) {
        out.push(format!(
            "the trace starts mid-run and the {} policy cannot take over PyTorch's state at its first entry: \
             it started by allocating the blocks live there, in address order (what came before is not in the trace), \
             and ran out of memory after {} of them",
            config.kind_name(),
            replay.started_by_allocating
        ));
    } else if replay.started_by_allocating > 0 {
        out.push(format!(
            "the trace starts mid-run and the {} policy cannot take over PyTorch's state at its first entry: \
             it started by allocating the {} blocks live there, in address order (what came before is not in the trace)",
            config.kind_name(),
            replay.started_by_allocating
        ));
    }
    if let Some(c) = config.options::<CachingConfig>() {
        if c.backend_cuda_malloc_async {
            out.push(
                "backend:cudaMallocAsync is not modelled: the trace was replayed under PyTorch's native caching \
                 allocator, so the numbers are not that backend's"
                    .to_string(),
            );
        }
    }
    out
}
