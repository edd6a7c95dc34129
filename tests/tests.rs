//! The integration test binary. One module per concern.

/// `diff`, iterations, report names, conversions, help and what writers say.
mod answers;
/// Exit codes, CSV headers and error messages of the `allocsim` binary.
mod cli;
/// Every policy through the same scenarios.
mod conformance;
/// RMM logs, named ids, pictures, PyTorch's memory viewer, realistic generators.
mod ecosystem;
/// The snapshot pickle recorded on the GPU against the JSON of the same run.
mod formats;
/// Hand-checked traces and expected CSVs (`UPDATE_EXPECT=1` rewrites the CSVs).
mod golden;
/// Real CUDA memory; skips without a driver unless `ALLOCSIM_REQUIRE_GPU=1`.
mod gpu;
/// Peak memory of the streamed commands against the trace's length (issue 12).
mod memory;
/// Property tests against a reference model.
mod model;
/// Nothing lost: outputs never overwrite inputs, replace old files only when complete,
/// and survive errors and Ctrl-C.
mod outputs;
/// Private pools recorded on the GPU: snapshots against the recorder's pools, 2.15's
/// pool ids.
mod pools;
/// PyTorch's own allocator tests, as traces.
mod pytorch_allocator;
/// The JSON of tools/record_torch.py read as a recorded run.
mod recorder;
/// Hostile and absurd inputs (issue 14): recorded addresses, huge devices, faults.
mod reliability;
/// Nothing points outside the repository.
mod selfcontained;
/// A trace that starts mid-run on a device below its starting state: an out-of-memory
/// before the first event in every command; the summary across a few such traces.
mod starting_state;
/// `allocsim sweep` and `allocsim merge`: the sweep file, rows, shards, the summary.
mod sweep;
/// Helpers: running the binary, temporary files.
mod util;
