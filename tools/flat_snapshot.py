"""python3 tools/flat_snapshot.py N_ENTRIES OUT.pickle

Writes a PyTorch-2.11-shaped snapshot pickle (protocol 4, memo, batches of 1000, as
Python's pickler writes _dump_snapshot) of N entries whose live state is flat: one
2 GiB segment allocated first, then allocations and frees of up to 512 live blocks in
it (one free in 7 recorded as free_requested, then free_completed), all freed at the
end; the final segments list that segment, free. About 59 bytes per entry, no stack
frames; written as it goes (constant memory). docs/performance.md ("Streaming a snapshot's replay")
replays these to show memory flat in the file's length, which the synthetic files of
workloads/benches/synth cannot (their final segments grow with them).

It writes about 100 k entries a second: `cargo run --release -p workloads --example
flat_snapshot -- N OUT.pickle` writes the same bytes about 80 times faster, and with
`--wrapped` a ring-buffer snapshot of the same kind ("Snapshots, late night")."""
import struct, sys

n_target = int(sys.argv[1]); out = open(sys.argv[2], "wb")
buf = bytearray(); memo = [0]
def memoize():
    buf.append(0x94); memo[0] += 1; return memo[0] - 1
def s(text):
    b = text.encode(); buf.append(0x8c); buf.append(len(b)); buf.extend(b)
keys = {}
def key(k):
    if k in keys:
        i = keys[k]; buf.extend(b"h" + bytes([i]) if i < 256 else b"j" + struct.pack("<I", i))
    else:
        s(k); keys[k] = memoize()
def uint(v):
    if v < 256: buf.extend(b"K" + bytes([v]))
    elif v < 65536: buf.extend(b"M" + struct.pack("<H", v))
    elif v < 2**31: buf.extend(b"J" + struct.pack("<i", v))
    else: buf.extend(b"\x8a\x08" + struct.pack("<q", v))
def flush():
    out.write(buf); buf.clear()
BASE = 0x7F00_0000_0000; SEG = 2 << 30
buf.extend(b"\x80\x04"); buf.extend(b"}"); memoize(); buf.extend(b"(")
key("segments"); buf.extend(b"]"); memoize(); buf.extend(b"(")
buf.extend(b"}"); memoize(); buf.extend(b"(")
for k, v in [("device", 0), ("address", BASE), ("total_size", SEG), ("allocated_size", 0), ("active_size", 0), ("requested_size", 0), ("stream", 0)]:
    key(k); uint(v)
key("segment_type"); key("large")
key("segment_pool_id"); uint(0); uint(0); buf.append(0x86); memoize()
key("is_expandable"); buf.append(0x89)
key("frames"); buf.extend(b"]"); empty = memoize()
key("blocks"); buf.extend(b"]"); memoize(); buf.extend(b"(")
buf.extend(b"}"); memoize(); buf.extend(b"(")
key("address"); uint(BASE); key("size"); uint(SEG); key("requested_size"); uint(0)
key("state"); key("inactive"); key("frames"); buf.extend(b"h" + bytes([empty]) if empty < 256 else b"j" + struct.pack("<I", empty))
buf.extend(b"ue"); buf.extend(b"ue")
key("device_traces"); buf.extend(b"]"); memoize(); buf.extend(b"(")
buf.extend(b"]"); memoize(); buf.extend(b"(")
state = 0x2545F4914F6CDD1D
def rnd():
    global state
    state ^= (state << 13) & 0xFFFFFFFFFFFFFFFF; state ^= state >> 7; state ^= (state << 17) & 0xFFFFFFFFFFFFFFFF
    return state
t = 1_795_391_990_920_542; count = 0; batch = 0
def entry(action, addr, size, stream=0):
    global t, count, batch
    if batch == 1000:
        buf.extend(b"e("); batch = 0
    batch += 1; count += 1; t += 7
    buf.extend(b"}"); memoize(); buf.extend(b"(")
    key("action"); key(action); key("addr"); uint(addr); key("size"); uint(size)
    key("stream"); uint(stream); key("time_us"); uint(t)
    key("compile_context"); s("N/A"); memoize()
    key("user_metadata"); key(""); key("frames")
    buf.extend(b"h" + bytes([empty]) if empty < 256 else b"j" + struct.pack("<I", empty))
    buf.extend(b"u")
    if len(buf) > 1 << 20: flush()
entry("segment_alloc", BASE, SEG)
slots = [None] * 512  # (addr, size) of live blocks; slot i owns [BASE + i*4 MiB, +4 MiB)
while count < n_target - 1100:
    i = rnd() % 512
    if slots[i] is None:
        size = 512 * (1 + rnd() % 8192)
        addr = BASE + i * (4 << 20)
        entry("alloc", addr, size); slots[i] = (addr, size)
    else:
        addr, size = slots[i]
        if rnd() % 7 == 0:
            entry("free_requested", addr, size)
        entry("free_completed", addr, size); slots[i] = None
for i in range(512):
    if slots[i] is not None:
        addr, size = slots[i]; entry("free_completed", addr, size); slots[i] = None
buf.extend(b"e")  # the device's entries
buf.extend(b"e")  # device_traces
buf.extend(b"u.")
flush(); out.close()
print(count, "entries")
