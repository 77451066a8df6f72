#!/usr/bin/env python3
"""Paged KV reads without attention: the memory system's own floor for `lean_paged`'s layouts.

Reads every byte of a K and a V cache once and reduces it to a few floats per program, for the
shapes of `backends/cuda/benches/lean_paged.rs`, in the layouts that bench builds:

  contiguous   K, V as `[batch, ctx, heads_kv, head_dim]` f16 (NHD)
  ordered      pools `[pages, page_size, heads_kv, head_dim]`, page k of sequence b at k * batch + b
               (the bench's table; for a batch of one the same addresses as contiguous)
  shuffled     the ordered table under one random permutation of the whole pool (as the bench)
  win256k      each sequence's pages shuffled only within windows of 256 KiB of its K
               (the bench's `--window-bytes 262144`)

for pages of 16 and 64 tokens, and in two read orders:

  by-head  (a) one program per (sequence, KV head, split of the context), walking that head's
               rows (head_dim x 2 bytes: 256 B at d 128, 128 B at d 64) of a token range through
               the page table, BLOCK_T rows a step (BLOCK_T x head_dim x 2 x (K, V) = 32 KB a
               step, the Lean kernel's stage), the page words of the next step read during this
               one, as the Lean kernel reads them a stage ahead;
  by-page  (b) one program per (sequence, split of its pages), reading whole pages (all heads:
               page_size x heads_kv x head_dim x 2 bytes, contiguous) 16 KB of K and 16 KB of V
               a step (the next page's word read during this page).

The first version (commit b2c2109, run 2026-11-27 03:12 UTC) read the page words in the step that
used them, so every step waited on a dependent table read first. Either way the paged programs
cost more than the contiguous ones even at the contiguous addresses (a batch of one, pages in
order): the table costs this probe its own time, so compare layouts to pages in order (see
docs/DEVICE_PATH.md, "Lean paged, seventeenth session: the memory system's floor").

Grids: splits = ceil(per_sm x SMs / units), units = batch x heads_kv (a) or batch (b), rounded
so that every split is whole steps (a) or whole pages (b); `--per-sm` lists the values run.

Each layout's per-program outputs must equal the contiguous layout's of the same order and grid
(same data, same arithmetic order), and the totals must equal a float64 reference computed with
torch; a shape that fails a check is reported and skipped, and the exit is non-zero. The
reduction is a weighted sum of squares (k^2 + v^2) x w, w from the logical token (a) or logical
page (b), so a wrong page, a wrong row or a wrong order within a program changes it.

Timing: every (order, grid, layout) is a CUDA graph of `per_batch` launches (at least 20, whole
rounds over `sets` copies of the caches, sets = ceil(4 x L2 / K+V bytes) as the bench), replayed
`--reps` times with the layouts interleaved; the time of a launch is a replay's event time over
per_batch, and the median over the replays is reported. A torch device-to-device copy gives
the ceiling (bytes read + written) in the same run.

Usage: python3 scripts/paged_read_probe.py [--per-sm 1,2,4] [--reps 25] [--only llama:1:8192]
       [--json out.json]
Needs a CUDA GPU, PyTorch and Triton.
"""

import argparse
import json
import math
import statistics
import sys
import time
import traceback


def build_parser():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--per-sm", default="1,2,4",
                    help="programs per SM the grids aim at, comma-separated (default 1,2,4)")
    ap.add_argument("--reps", type=int, default=25, help="timed graph replays per layout (>= 20)")
    ap.add_argument("--only", default=None,
                    help="one shape as name:batch:ctx, e.g. llama:1:8192 or lean:4:16384")
    ap.add_argument("--json", default=None, help="write every row and check here")
    return ap


if __name__ == "__main__":
    build_parser().parse_args()  # --help and argument errors before torch and Triton load

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

# (name, batch, heads_kv, head_dim, ctx): lean_paged's list (heads_q does not matter here)
SHAPES = [
    ("llama", 1, 8, 128, 8192),
    ("llama", 1, 8, 128, 32768),
    ("llama", 8, 8, 128, 8192),
    ("llama", 64, 8, 128, 1024),
    ("lean", 1, 56, 64, 65536),
    ("lean", 4, 56, 64, 16384),
]
PAGES = (16, 64)
WINDOW_BYTES = 256 * 1024
STAGE_BYTES = 32 * 1024  # K and V bytes a by-head program reads a step (the Lean kernel's stage)
CHUNK = 8192  # elements of K (and of V) a by-page program reads a step: 16 KB each
MOD = 61  # weights cycle over 61 tokens / pages: prime, so no page size aligns with it


@triton.jit
def read_by_head(k_ptr, v_ptr, table_ptr, out_ptr, ctx, heads_kv, row, max_pages, splits,
                 split_tokens, PAGED: tl.constexpr, PAGE: tl.constexpr, D: tl.constexpr,
                 BLOCK_T: tl.constexpr, MOD: tl.constexpr):
    """Program (b, h, split): rows of head h, tokens [split x split_tokens, + split_tokens)."""
    pid = tl.program_id(0)
    split = pid % splits
    bh = pid // splits
    h = bh % heads_kv
    b = bh // heads_kv
    t_begin = split * split_tokens
    t_end = tl.minimum(t_begin + split_tokens, ctx)
    rows = tl.arange(0, BLOCK_T)
    cols = tl.arange(0, D)
    acc = tl.zeros([BLOCK_T, D], tl.float32)
    if PAGED:  # the page words of a step are read one step ahead, as the Lean kernel does
        pages_next = tl.load(table_ptr + b * max_pages + (t_begin + rows) // PAGE)
    for t0 in range(t_begin, t_end, BLOCK_T):
        t = t0 + rows
        if PAGED:
            page = pages_next
            t_next = tl.minimum(t + BLOCK_T, ctx - 1)
            pages_next = tl.load(table_ptr + b * max_pages + t_next // PAGE)
            slot = page.to(tl.int64) * PAGE + t % PAGE
        else:
            slot = b.to(tl.int64) * ctx + t
        off = slot[:, None] * row + h * D + cols[None, :]
        k = tl.load(k_ptr + off).to(tl.float32)
        v = tl.load(v_ptr + off).to(tl.float32)
        w = (t % MOD + 1).to(tl.float32)
        acc += (k * k + v * v) * w[:, None]
    tl.store(out_ptr + pid, tl.sum(tl.sum(acc, axis=1), axis=0))


@triton.jit
def read_by_page(k_ptr, v_ptr, table_ptr, out_ptr, max_pages, page_elems, splits, split_pages,
                 PAGED: tl.constexpr, CHUNK: tl.constexpr, MOD: tl.constexpr):
    """Program (b, split): whole pages [split x split_pages, + split_pages) of sequence b."""
    pid = tl.program_id(0)
    split = pid % splits
    b = pid // splits
    p_begin = split * split_pages
    p_end = tl.minimum(p_begin + split_pages, max_pages)
    idx = tl.arange(0, CHUNK)
    acc = tl.zeros([CHUNK], tl.float32)
    if PAGED:  # the next page's word is read a page ahead
        page_next = tl.load(table_ptr + b * max_pages + p_begin)
    for p in range(p_begin, p_end):
        if PAGED:
            base = page_next.to(tl.int64) * page_elems
            page_next = tl.load(table_ptr + b * max_pages + tl.minimum(p + 1, max_pages - 1))
        else:
            base = (b.to(tl.int64) * max_pages + p) * page_elems
        w = (p % MOD + 1).to(tl.float32)
        for c in range(0, page_elems // CHUNK):
            off = base + c * CHUNK + idx
            k = tl.load(k_ptr + off).to(tl.float32)
            v = tl.load(v_ptr + off).to(tl.float32)
            acc += (k * k + v * v) * w
    tl.store(out_ptr + pid, tl.sum(acc, axis=0))


class ProbeError(Exception):
    """A layout's reduction differs from contiguous's or from the float64 reference."""


def page_tables(batch, ctx, page, row_bytes, seed):
    """The bench's tables for one page size, [batch, max_pages]: ordered, shuffled, win256k."""
    max_pages = ctx // page
    n = batch * max_pages
    i = torch.arange(n)
    ordered = (i % max_pages) * batch + i // max_pages  # row b: logical page k at k * batch + b
    g = torch.Generator().manual_seed(seed)
    shuffled = ordered[torch.randperm(n, generator=g)]
    win = ordered.clone().view(batch, max_pages)
    per_win = max(1, WINDOW_BYTES // (page * row_bytes))
    for b in range(batch):
        for w0 in range(0, max_pages, per_win):
            seg = win[b, w0:w0 + per_win]
            win[b, w0:w0 + per_win] = seg[torch.randperm(seg.numel(), generator=g)]
    return {
        "ordered": ordered.view(batch, max_pages),
        "shuffled": shuffled.view(batch, max_pages),
        "win256k": win,
    }, per_win


def to_pool(x, table, page):
    """Scatter a contiguous cache [batch, ctx, hk, d] into a pool laid out by `table`."""
    batch, ctx, hk, d = x.shape
    pool = torch.full((table.numel(), page, hk, d), float("nan"), dtype=x.dtype, device=x.device)
    pool[table.reshape(-1).to(x.device)] = x.reshape(batch * (ctx // page), page, hk, d)
    assert not pool.isnan().any(), "a pool page was not written"
    return pool


def splits_for(units, steps, target):
    """Splits of `steps` whole steps over `units` so that units x splits is about `target`."""
    want = max(1, min(steps, math.ceil(target / units)))
    per = math.ceil(steps / want)
    return math.ceil(steps / per), per


def event_time_ms(fn, reps=20):
    ts = []
    for _ in range(3):
        fn()
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def copy_ceiling_gbs():
    """Device-to-device copy of 1 GiB, bytes read + written over the median time."""
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    ms = event_time_ms(lambda: dst.copy_(src))
    del src, dst
    return 2 * n / ms / 1e6


def run_shape(shape, args, sms, l2):
    name, batch, hk, d, ctx = shape
    row = hk * d  # elements per token
    row_bytes = row * 2
    kv_bytes = 2 * batch * ctx * row_bytes
    sets = min(64, max(1, math.ceil(4 * l2 / kv_bytes)))
    per_batch = math.ceil(20 / sets) * sets
    dev = "cuda"

    # sets copies of K and V, uniform in [-2, 2) like the bench's fill
    gen = torch.Generator(device=dev).manual_seed(7)
    ks, vs = [], []
    for _ in range(sets):
        ks.append((torch.rand(batch, ctx, hk, d, generator=gen, device=dev) * 4 - 2).half())
        vs.append((torch.rand(batch, ctx, hk, d, generator=gen, device=dev) * 4 - 2).half())

    # float64 references from set 0: per-token sums of squares, weighted by token or page
    s = (ks[0].float().square().sum((2, 3)) + vs[0].float().square().sum((2, 3))).double()
    t = torch.arange(ctx, device=dev)
    ref_head = (s * (t % MOD + 1)).sum().item()
    ref_page = {p: (s * ((t // p) % MOD + 1)).sum().item() for p in PAGES}

    # layouts: (label, page, table, [(k, v) per set]); contiguous has page None
    layouts = [("contiguous", None, None, list(zip(ks, vs)))]
    windows = {}
    for page in PAGES:
        tables, windows[page] = page_tables(batch, ctx, page, row_bytes, seed=page)
        for kind, table in tables.items():
            perm = table.reshape(-1).sort().values
            assert torch.equal(perm, torch.arange(table.numel())), "table is not a permutation"
            kv = [(to_pool(k, table, page), to_pool(v, table, page)) for k, v in zip(ks, vs)]
            layouts.append((f"{kind}{page}", page, table.to(dev, torch.int32).contiguous(), kv))
    dummy_table = torch.zeros(1, dtype=torch.int32, device=dev)

    block_t = STAGE_BYTES // (2 * d * 2)
    variants = []  # (order, per_sm, grid, split text, launch(layout, set, out), ref(layout))
    for per_sm in args.per_sm:
        splits, per = splits_for(batch * hk, ctx // block_t, per_sm * sms)
        grid_a = batch * hk * splits
        split_tokens = per * block_t

        def launch_a(lay, i, out, splits=splits, split_tokens=split_tokens, grid=grid_a):
            label, page, table, kv = lay
            k, v = kv[i]
            read_by_head[(grid,)](
                k, v, table if page else dummy_table, out, ctx, hk, row,
                ctx // (page or 1), splits, split_tokens,
                PAGED=page is not None, PAGE=page or 1, D=d, BLOCK_T=block_t, MOD=MOD,
                num_warps=4)

        desc_a = f"{batch}x{hk}x{splits} ({split_tokens} tokens)"
        variants.append(("by-head", per_sm, grid_a, desc_a, launch_a, lambda lay: ref_head))

        for page in PAGES:
            assert (page * row) % CHUNK == 0, "a page must be whole chunks"
            splits_b, per_b = splits_for(batch, ctx // page, per_sm * sms)
            grid_b = batch * splits_b

            def launch_b(lay, i, out, page=page, splits=splits_b, per=per_b, grid=grid_b):
                label, lpage, table, kv = lay
                k, v = kv[i]
                read_by_page[(grid,)](
                    k, v, table if lpage else dummy_table, out, ctx // page, page * row,
                    splits, per, PAGED=lpage is not None, CHUNK=CHUNK, MOD=MOD, num_warps=4)

            desc_b = f"{batch}x{splits_b} ({per_b} pages)"
            variants.append((f"by-page{page}", per_sm, grid_b, desc_b, launch_b,
                             lambda lay, page=page: ref_page[page]))

    def applies(order, lay):
        # by-page reads pages of one size: its layouts are that size's and contiguous
        return order == "by-head" or lay[1] is None or order == f"by-page{lay[1]}"

    # correctness: poisoned outputs, every program written, each layout equal to contiguous's
    checks = []
    for order, per_sm, grid, desc, launch, ref in variants:
        base = None
        for lay in layouts:
            if not applies(order, lay):
                continue
            out = torch.full((grid,), float("nan"), dtype=torch.float32, device=dev)
            launch(lay, 0, out)
            torch.cuda.synchronize()
            if out.isnan().any():
                raise ProbeError(f"{name} {order} {lay[0]}: an output was not written")
            if base is None:
                base = out.clone()
            exact = torch.equal(out, base)
            rel = ((out - base).abs().max() / base.abs().max()).item()
            total = out.double().sum().item()
            ref_rel = abs(total - ref(lay)) / abs(ref(lay))
            checks.append({"order": order, "per_sm": per_sm, "layout": lay[0], "exact": exact,
                           "max_rel_vs_contiguous": rel, "rel_vs_float64": ref_rel})
            if rel > 1e-6 or ref_rel > 1e-4:
                raise ProbeError(f"{name} {order} per_sm {per_sm} {lay[0]}: differs from contiguous"
                                 f" (max rel {rel:.2e}) or from float64 (rel {ref_rel:.2e})")

    # graphs: per_batch launches rotating over the sets, one graph per (variant, layout)
    graphs = []
    for vi, (order, per_sm, grid, desc, launch, ref) in enumerate(variants):
        for lay in layouts:
            if not applies(order, lay):
                continue
            out = torch.empty(grid, dtype=torch.float32, device=dev)
            launch(lay, 0, out)  # compiled before capture
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for i in range(per_batch):
                    launch(lay, i % sets, out)
            graphs.append((vi, lay[0], g, out))
    for _, _, g, _ in graphs:  # warm-up
        g.replay()
    torch.cuda.synchronize()
    events = {(vi, label): [] for vi, label, _, _ in graphs}
    for _ in range(args.reps):  # layouts interleaved within each round
        for vi, label, g, _ in graphs:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            g.replay()
            b.record()
            events[(vi, label)].append((a, b))
    torch.cuda.synchronize()

    rows = []
    for vi, (order, per_sm, grid, desc, launch, ref) in enumerate(variants):
        us = {label: statistics.median(a.elapsed_time(b) * 1e3 / per_batch for a, b in ev)
              for (v, label), ev in events.items() if v == vi}
        spread = {label: (min(a.elapsed_time(b) for a, b in ev) * 1e3 / per_batch,
                          max(a.elapsed_time(b) for a, b in ev) * 1e3 / per_batch)
                  for (v, label), ev in events.items() if v == vi}
        for label, u in us.items():
            rows.append({"shape": name, "batch": batch, "heads_kv": hk, "head_dim": d, "ctx": ctx,
                         "sets": sets, "per_batch": per_batch, "order": order, "per_sm": per_sm,
                         "grid": grid, "split": desc, "layout": label, "us": u,
                         "us_min": spread[label][0], "us_max": spread[label][1],
                         "gbs": kv_bytes / u / 1e3, "vs_contiguous": u / us["contiguous"]})
    del graphs, layouts, ks, vs
    torch.cuda.empty_cache()
    return rows, checks, {"sets": sets, "per_batch": per_batch, "windows_pages": windows,
                          "block_t": block_t}


def main():
    ap = build_parser()
    args = ap.parse_args()
    args.per_sm = [int(x) for x in args.per_sm.split(",")]
    if args.reps < 20:
        ap.error("--reps must be at least 20")
    shapes = SHAPES
    if args.only:
        n, b, c = args.only.split(":")
        shapes = [s for s in SHAPES if (s[0], s[1], s[4]) == (n, int(b), int(c))]
        if not shapes:
            ap.error(f"{args.only} is not in the list")

    props = torch.cuda.get_device_properties(0)
    sms, l2 = props.multi_processor_count, props.L2_cache_size
    ceiling = copy_ceiling_gbs()
    print(f"device {props.name}, {sms} SMs, L2 {l2 >> 20} MiB; torch {torch.__version__}, "
          f"triton {triton.__version__}; copy ceiling {ceiling:.0f} GB/s (read + write, 1 GiB)")
    all_rows, all_checks, meta, failed = [], [], {}, []
    for shape in shapes:
        key = f"{shape[0]}:{shape[1]}:{shape[4]}"
        t0 = time.time()
        try:
            rows, checks, m = run_shape(shape, args, sms, l2)
        except Exception as e:  # a failed check or a launch error: report it, go on
            print(f"\n{key}: FAILED: {type(e).__name__}: {e}")
            traceback.print_exc()
            failed.append(key)
            torch.cuda.empty_cache()
            continue
        all_rows += rows
        all_checks += checks
        meta[key] = m
        exact = all(c["exact"] for c in checks)
        print(f"\n{key} (hk {shape[2]}, d {shape[3]}): sets {m['sets']}, {m['per_batch']} launches "
              f"a replay, BLOCK_T {m['block_t']}, win256k pages/window {m['windows_pages']}; "
              f"{len(checks)} checks passed ({'all bit-exact' if exact else 'not all bit-exact'}); "
              f"{time.time() - t0:.1f} s")
        print(f"  {'order':<10} {'/SM':>3} {'grid':>5} {'split':<24} {'layout':<11} {'us':>9} "
              f"{'GB/s':>6} {'/contig':>7}")
        for r in rows:
            print(f"  {r['order']:<10} {r['per_sm']:>3} {r['grid']:>5} {r['split']:<24} "
                  f"{r['layout']:<11} {r['us']:>9.2f} {r['gbs']:>6.0f} {r['vs_contiguous']:>7.3f}")
        sys.stdout.flush()
        if args.json:  # after every shape, so a cut run keeps what it measured
            with open(args.json, "w") as f:
                json.dump({"device": props.name, "sms": sms, "l2_bytes": l2,
                           "copy_ceiling_gbs": ceiling, "torch": torch.__version__,
                           "triton": triton.__version__, "shapes": meta, "failed": failed,
                           "rows": all_rows, "checks": all_checks}, f, indent=1)
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
        sys.exit(1)

if __name__ == "__main__":
    main()
