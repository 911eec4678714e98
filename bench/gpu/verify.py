#!/usr/bin/env python3
"""Readers and the table of bench/gpu/verify.sh.

Each reader takes one output of a part's command (a `tandem train` log, a trace, an
ncu log, regime JSON lines, a `bench scale` JSON line, a test binary's output) and
appends measured rows to the part's measured file, one row a line:

    id <TAB> value <TAB> note

`table` joins measured files with bench/gpu/predictions.tsv into the markdown table
predicted | measured | ok? that a session commits under docs/records/.

Only the Python standard library is used: the GPU machine's Python has it, and so
does the development machine's.
"""
import collections
import json
import math
import re
import sys

# ---------------------------------------------------------------- measured rows


def emit(out, key, value, note=""):
    """Appends one measured row and echoes it."""
    if isinstance(value, float):
        value = f"{value:.4g}" if abs(value) < 1e4 else f"{value:.0f}"
    line = f"{key}\t{value}\t{note}".replace("\n", " ")
    with open(out, "a", encoding="utf-8") as f:
        f.write(line + "\n")
    print(f"  measured {key} = {value}" + (f"  ({note})" if note else ""))


def read_measured(paths):
    """id -> (value, note) over measured files (a later row replaces an earlier one)."""
    rows = {}
    for p in paths:
        try:
            with open(p, encoding="utf-8") as f:
                for line in f:
                    parts = line.rstrip("\n").split("\t")
                    if len(parts) >= 2 and parts[0] and not parts[0].startswith("#"):
                        rows[parts[0]] = (parts[1], parts[2] if len(parts) > 2 else "")
        except FileNotFoundError:
            pass
    return rows


def number(value):
    """A measured value as a float, or None (skipped, text)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def read_text(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


# ---------------------------------------------------------------- readers


def train(out, prefix, log):
    """`tandem train`: mean epoch time, test accuracy, what `auto` chose."""
    text = read_text(log)
    m = re.search(r"mean epoch time ([0-9.]+) s", text) or re.search(
        r"epoch time ([0-9.]+) s \(one epoch\)", text
    )
    if m:
        emit(out, f"{prefix}.epoch_s", float(m.group(1)),
             "one epoch" if "(one epoch)" in m.group(0) else "excluding epoch 0")
    else:
        # A long epoch cut off before its row: the last progress line
        # (`epoch 0:  30% (14718/49061 batches) 41.2 s, 2.80 ms a batch`).
        prog = re.findall(r"epoch \d+: +\d+% \((\d+)/(\d+) batches\) [0-9.]+ s, ([0-9.]+) ms a batch", text)
        err = [l for l in text.splitlines() if "error" in l.lower()]
        if prog and not err:
            done, total, ms = int(prog[-1][0]), int(prog[-1][1]), float(prog[-1][2])
            emit(out, f"{prefix}.epoch_s", ms * total / 1e3,
                 f"extrapolated: {ms} ms a batch over {done} of {total} batches (no epoch row)")
        else:
            emit(out, f"{prefix}.epoch_s", "failed", (err[-1] if err else "no epoch time in " + log)[:160])
    m = re.search(r"test accuracy ([0-9.]+)", text)
    if m:
        emit(out, f"{prefix}.test_acc", float(m.group(1)), "at the best validation epoch")
    m = re.search(r"test mrr ([0-9.]+)", text)  # the link task's first metric
    if m:
        emit(out, f"{prefix}.test_mrr", float(m.group(1)), "at the best validation epoch")
    # The placement line (`orchestration.policy = "auto" chose ...`), not the
    # device line's `device.topology = "auto" chose ...`.
    m = re.search(r'orchestration.policy = "auto" chose (.+)', text) or re.search(r'"auto" on the host backend is ([\w-]+)', text)
    if not m and re.search(r'"auto" on the host backend: ', text):
        # A host dry run: one device, nothing placed.
        emit(out, f"{prefix}.auto", "host", "the host backend: sampling, gathering and training on the CPU")
    if m:
        choice = re.split(r" \(fastest\)|;", m.group(1))[0].strip()
        # "layer (cpu split 30000)" -> "layer"; a step-based name stays whole.
        name = choice.split(" ")[0]
        emit(out, f"{prefix}.auto", name, choice[:120])


def peer(out, prefix, log):
    """The PyTorch + PyG program's last line."""
    text = read_text(log)
    m = re.search(r"torchgpu epoch_s=([0-9.]+) test_acc=([0-9.]+)", text)
    if m:
        emit(out, f"{prefix}.epoch_s", float(m.group(1)), "torch_gpu_train.py, mean of epochs 1..")
        emit(out, f"{prefix}.test_acc", float(m.group(2)), "sampled evaluation")
    else:
        tail = [l for l in text.splitlines() if l.strip()][-1:] or ["no output"]
        emit(out, f"{prefix}.epoch_s", "failed", tail[0][:160])


def peer_link(out, prefix, log):
    """The PyTorch + PyG link program's last line (bench/peers/torch_gpu_link.py)."""
    text = read_text(log)
    m = re.search(r"torchgpu-link epoch_s=([0-9.]+) (.*?)batches=(\d+) extrapolated=(\d)", text)
    if m:
        how = "extrapolated from its first batches" if m.group(4) == "1" else "whole epochs"
        emit(out, f"{prefix}.epoch_s", float(m.group(1)),
             f"torch_gpu_link.py, mean of epochs 1.., {m.group(3)} batches, {how}")
        t = re.search(r"test_mrr=([0-9.]+)", m.group(2))
        if t:
            emit(out, f"{prefix}.test_mrr", float(t.group(1)), "full-graph evaluation after the batches it trained")
    else:
        tail = [l for l in text.splitlines() if l.strip()][-1:] or ["no output"]
        emit(out, f"{prefix}.epoch_s", "failed", tail[0][:160])


def tests(out, prefix, log, *owed):
    """A libtest binary run with --nocapture: pass/FAIL, skips, and named cases."""
    text = read_text(log)
    results = re.findall(r"test result: (\w+)\. (\d+) passed; (\d+) failed", text)
    if not results:
        emit(out, prefix, "failed", "no test result line (crashed or timed out)")
        return
    passed = sum(int(p) for _, p, _ in results)
    failed = sum(int(f) for _, _, f in results)
    emit(out, prefix, "pass" if failed == 0 else "FAIL", f"{passed} passed, {failed} failed")
    skipped = len(re.findall(r"skipped: ", text))
    emit(out, f"{prefix}.skipped", skipped, "`skipped:` lines: no GPU or library")
    if owed:
        ok = [n for n in owed if re.search(r"test \S*" + re.escape(n) + r" \.\.\. ok", text)]
        missing = [n for n in owed if n not in ok]
        emit(out, f"{prefix}.named", len(ok), "not ok: " + ", ".join(missing) if missing else "all ran and passed")


def _events(trace):
    with open(trace, encoding="utf-8") as f:
        d = json.load(f)
    return d["traceEvents"] if isinstance(d, dict) else d


def _epoch_of(e):
    a = e.get("args", {})
    return a.get("epoch")


def syncs(out, prefix, trace):
    """Host synchronizations per 8 steady batches from the cumulative counters
    `host.syncs` (compute stream) and `host.syncs.sampling` (the sampling sibling):
    one sample per trained batch; the second half of the samples is the last epoch."""
    ev = _events(trace)
    for name, key in (("host.syncs", "compute_per8"), ("host.syncs.sampling", "sampling_per8")):
        vals = [float(next(iter(e["args"].values()))) for e in ev
                if e.get("ph") == "C" and e.get("name") == name and e.get("args")]
        steady = vals[len(vals) // 2:]
        w = [steady[i + 8] - steady[i] for i in range(len(steady) - 8)]
        if w:
            emit(out, f"{prefix}.{key}", max(w), f"max over windows of 8 batches of the last epoch; mean {sum(w) / len(w):.2f}; {len(vals)} samples")
        elif len(steady) >= 2:
            rate = (steady[-1] - steady[0]) / (len(steady) - 1)
            emit(out, f"{prefix}.{key}", 8 * rate, f"8 x the rate over the last epoch's {len(steady)} batches (too few for a window of 8)")
        else:
            emit(out, f"{prefix}.{key}", "n/a", f"{len(vals)} `{name}` samples in the trace")
    nvml = sum(1 for e in ev if e.get("ph") == "C" and str(e.get("name", "")).startswith("acc0."))
    emit(out, f"{prefix}.nvml_samples", nvml, "`acc0.util` / `acc0.mem_used_mib` counter samples (NVML)")


def layer_trace(out, prefix, trace):
    """The layer path's accelerator thread, last epoch: host synchronizations of the
    `train` slices, `publish` slices, loss and bottom reads per super-batch."""
    ev = _events(trace)
    xs = [e for e in ev if e.get("ph") == "X"]
    epochs = [_epoch_of(e) for e in xs if e.get("name") == "train" and _epoch_of(e) is not None]
    last = max(epochs) if epochs else None

    def steady(name):
        s = [e for e in xs if e.get("name") == name]
        if last is not None:
            s = [e for e in s if _epoch_of(e) in (None, last)] if any(_epoch_of(e) is not None for e in s) else s[len(s) // 2:]
        else:
            s = s[len(s) // 2:]
        return s

    tr = steady("train")
    if not tr:
        emit(out, f"{prefix}.train_syncs", "n/a", "no `train` slices (not the layer path?)")
        return
    hs = [e.get("args", {}).get("host_syncs", 0) for e in tr]
    emit(out, f"{prefix}.train_syncs", max(hs), f"max `host_syncs` of {len(tr)} `train` slices of the last epoch")
    emit(out, f"{prefix}.train_syncs_mean", sum(hs) / len(hs), f"mean over {len(tr)} `train` slices")
    zf = [e.get("args", {}).get("zero_fills") for e in tr if "zero_fills" in e.get("args", {})]
    if zf:
        emit(out, f"{prefix}.zero_fills", max(zf), "max `zero_fills` of a `train` slice, last epoch")
    pub = steady("publish")
    if pub:
        ps = [e.get("args", {}).get("host_syncs", 0) for e in pub]
        emit(out, f"{prefix}.publish_syncs", max(ps), f"max `host_syncs` of {len(pub)} `publish` slices")
    launches = len(steady("launch")) or 1
    for name in ("loss read", "bottom read", "sample bottom"):
        n = len(steady(name))
        emit(out, f"{prefix}.{name.replace(' ', '_')}_per_sb", n / launches, f"{n} `{name}` slices over {launches} super-batches")
    sw = steady("sample wait")
    if sw:
        med = sorted(e["dur"] for e in sw)[len(sw) // 2] / 1e3
        emit(out, f"{prefix}.sample_wait_ms", med, f"median of {len(sw)} `sample wait` slices (planner track)")


SAMPLING_KERNELS = ("sample_count_scan", "sample_pick", "unique_insert", "unique_flag_scan",
                    "unique_scatter", "scan_u32_tiles", "scan_u32_add", "scan_u64_tiles",
                    "scan_u64_add", "sample_count", "unique_flag", "relabel_counts")
UNFUSED = ("relu_forward", "dropout_forward", "relu_backward", "dropout_backward")


def ncu(out, prefix, log):
    """ncu --print-summary per-kernel over a window of launches: launches and kernel
    time per batch (a batch = gather_rows to gather_rows), GCN-only kernels."""
    text = read_text(log)
    seq = re.findall(r'==PROF== Profiling "([^"]*)"', text)
    starts = [i for i, n in enumerate(seq) if n == "gather_rows"]
    if len(starts) < 2:
        emit(out, f"{prefix}.launches", "n/a", f"{len(seq)} launches profiled, {len(starts)} gather_rows")
        return
    nb = len(starts) - 1
    window = seq[starts[0]:starts[-1]]
    emit(out, f"{prefix}.launches", len(window) / nb, f"launches per batch over {nb} batches (gather_rows to gather_rows)")
    samp = sum(window.count(k) for k in SAMPLING_KERNELS)
    emit(out, f"{prefix}.sampling_launches", samp / nb, "sampling kernels per batch")
    emit(out, f"{prefix}.gcn_weight_launches", sum(seq.count(k) for k in ("block_out_degree", "block_src_weight")), "over the whole window (SAGE: none)")
    emit(out, f"{prefix}.unfused_launches", sum(seq.count(k) for k in UNFUSED), "relu/dropout forward and backward kernels (fused: none)")
    red = [n for n in window if re.search(r"splitk", n, re.I)]
    emit(out, f"{prefix}.splitk_per_batch", len(red) / nb, "split-K reduction launches per batch")
    # Kernel time from the per-kernel summary: average x invocations, over the batches profiled.
    tot, cur = 0.0, None
    scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
    for line in text.splitlines():
        m = re.match(r"\s+(.+?) \(\d+, \d+, \d+\)x\(.*Invocations (\d+)", line)
        if m:
            cur = int(m.group(2))
            continue
        m = re.match(r"\s+gpu__time_duration.sum\s+(\S+)\s+\S+\s+\S+\s+(\S+)", line)
        if m and cur:
            tot += float(m.group(2).replace(",", "")) * scale.get(m.group(1), 1.0) * cur
            cur = None
    batches = len(seq) / (len(window) / nb)
    if tot > 0:
        emit(out, f"{prefix}.kernel_us", tot / batches, f"kernel time per batch, caches flushed (upper bound); {len(seq)} launches = {batches:.1f} batches")


def regimes(out, prefix, jsonl):
    """`tandem bench orchestration --regimes --json`: per regime the best step-based
    placement, layer and auto against it, layer's accuracy against it."""
    rows = []
    for line in read_text(jsonl).splitlines():
        line = line.strip()
        if line:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    if not rows:
        emit(out, f"{prefix}.rows", 0, f"no JSON lines in {jsonl}")
        return
    groups = collections.OrderedDict()
    for r in rows:
        key = (r.get("dim"), r.get("cache_fraction"), r.get("row_dtype", "f32"))
        groups.setdefault(key, []).append(r)
    step_names = ("cpu-sample-cpu-gather", "gpu-sample-cpu-gather", "cpu-sample-gpu-gather", "gpu-sample-gpu-gather")
    for (dim, frac, dtype), rs in groups.items():
        tag = f"{prefix}.{dim}.{frac:g}.{dtype}"
        steps = [r for r in rs if r.get("policy") in step_names and r.get("epoch_secs")]
        if not steps:
            continue
        best = min(steps, key=lambda r: r["epoch_secs"])
        emit(out, f"{tag}.best_step_s", best["epoch_secs"], best["policy"])
        for r in rs:
            if r.get("policy") == "layer" and r.get("epoch_secs"):
                emit(out, f"{tag}.layer_vs_best", best["epoch_secs"] / r["epoch_secs"], f"layer {r['epoch_secs']:.3f} s at hot {r.get('hot_ratio')}")
                emit(out, f"{tag}.layer_acc_delta", r["test_acc"] - best["test_acc"], "test accuracy, layer minus the best step-based")
            if r.get("policy") == "auto" and r.get("epoch_secs"):
                fixed = [x for x in rs if x.get("policy") != "auto" and x.get("epoch_secs")]
                b = min(fixed, key=lambda x: x["epoch_secs"])
                emit(out, f"{tag}.auto_vs_best", r["epoch_secs"] / b["epoch_secs"], f"auto {r['epoch_secs']:.3f} s; best fixed {b['policy']} {b['epoch_secs']:.3f} s")


def scale(out, prefix, path):
    """`tandem bench scale --json`: times, accuracy and peaks."""
    try:
        r = json.loads(read_text(path).strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        emit(out, f"{prefix}.epoch_s", "failed", f"no JSON line in {path}")
        return
    gib = 2.0 ** 30
    emit(out, f"{prefix}.generate_s", r.get("generate_secs"), "generation, in memory")
    if r.get("generate_peak_rss"):
        emit(out, f"{prefix}.generate_peak_gib", r["generate_peak_rss"] / gib, "VmHWM of generation")
    emit(out, f"{prefix}.arrays_gib", r.get("store_bytes", 0) / gib, f"{r.get('stored_edges')} stored edges")
    emit(out, f"{prefix}.epoch_s", r.get("steady_epoch_secs"), "mean epoch time excluding epoch 0")
    if r.get("test_acc") is not None:
        emit(out, f"{prefix}.test_acc", r["test_acc"], f"{r.get('classes')} classes: chance {1 / max(r.get('classes', 1), 1):.4f}")
    if r.get("train_peak_rss"):
        emit(out, f"{prefix}.train_peak_gib", r["train_peak_rss"] / gib, "VmHWM of training")
        emit(out, f"{prefix}.train_peak_over_arrays_gib", (r["train_peak_rss"] - r.get("store_bytes", 0)) / gib, "training peak minus the arrays")
    if r.get("peak_device_bytes"):
        emit(out, f"{prefix}.device_peak_gib", r["peak_device_bytes"] / gib, "NVML, sampled at 10 Hz")
    if r.get("placement"):
        emit(out, f"{prefix}.placement", "printed", r["placement"][:160])


def backend(out, prefix, log):
    """`tandem bench backend`: rates and the synchronization line."""
    text = read_text(log)
    pats = {
        "sample_medges": r"^sample\s+([0-9.]+) M edges/s",
        "gather_cached_vs_copy": r"^gather \(all cached\).*?([0-9.]+)×",
        "gather_host_gbs": r"^gather \(all from host\)\s+([0-9.]+) GB/s",
        "gather_bf16_host_gbs": r"^gather bf16 \(host\)\s+([0-9.]+) GB/s",
        "tf32_vs_fp32": r"^gemm tf32 .*?([0-9.]+)× fp32",
    }
    for key, pat in pats.items():
        m = re.search(pat, text, re.M)
        emit(out, f"{prefix}.{key}", float(m.group(1)) if m else "n/a", "" if m else "line not found")
    m = re.search(r"host syncs: (\d+) per sampled batch \((\d+) layers\), (\d+) per gather", text)
    if m:
        emit(out, f"{prefix}.syncs_per_sampled_batch", int(m.group(1)), f"{m.group(2)} layers; {m.group(3)} per gather")


def loader(out, prefix, log):
    """`tandem bench loader`: both loaders' batches/s, their ratio and the hit rate
    (from its `json:` line)."""
    m = re.search(r"^json: (\{.*\})$", read_text(log), re.M)
    if not m:
        emit(out, f"{prefix}.ratio", "failed", "no json line in the output")
        return
    r = json.loads(m.group(1))
    emit(out, f"{prefix}.device_batches_per_s", r["device_batches_per_s"], r["note"][:150])
    emit(out, f"{prefix}.host_batches_per_s", r["host_batches_per_s"], f"{r['threads']} workers")
    emit(out, f"{prefix}.ratio", r["ratio"], "device loader over host loader, same seeds")
    emit(out, f"{prefix}.hit_rate", r["hit_rate"], "device feature cache, timed epoch")


def pyg_loader(out, prefix, path):
    """`bench/peers/pyg_loader.py --device cuda`: the PyG model's epoch fed by the
    device loader, by the host loader, by PyG's loader where it runs; their ratios."""
    with open(path, encoding="utf-8") as f:
        r = json.loads(f.read())
    emit(out, f"{prefix}.device_epoch_s", r["tandem_epoch_s"], f"acc {r.get('tandem_test_acc', 0):.4f}")
    if "tandem_host_epoch_s" in r:
        emit(out, f"{prefix}.host_epoch_s", r["tandem_host_epoch_s"], f"acc {r.get('tandem_host_test_acc', 0):.4f}")
        emit(out, f"{prefix}.host_over_device", r["tandem_host_epoch_s"] / r["tandem_epoch_s"],
             "host loader's epoch over the device loader's, same model")
        emit(out, f"{prefix}.acc_delta", r["tandem_test_acc"] - r["tandem_host_test_acc"], "device minus host")
    if "pyg_epoch_s" in r:
        emit(out, f"{prefix}.pyg_over_device", r["pyg_epoch_s"] / r["tandem_epoch_s"],
             "PyG's NeighborLoader's epoch over the device loader's")
    else:
        emit(out, f"{prefix}.pyg_over_device", "skipped", "PyG's NeighborLoader needs pyg-lib or torch-sparse")


def hot(out, prefix, log):
    """`tandem bench hot`: the fused kernel's µs per row per worker and rows/s over
    all workers (the bf16-row kernel when it was timed)."""
    text = read_text(log)
    rows = {m.group(1): (float(m.group(2)), float(m.group(3)))
            for m in re.finditer(r"^(old|fused|fused-bf16)\s+([0-9.]+)\s+[0-9.]+\s+([0-9.]+)\s", text, re.M)}
    key = "fused-bf16" if "fused-bf16" in rows else "fused"
    if key in rows:
        us, per_s = rows[key]
        emit(out, f"{prefix}.us_per_row", us, f"{key}, best, µs per row per worker")
        emit(out, f"{prefix}.rows_per_s", per_s, f"{key}, best, rows/s over all workers")
    else:
        emit(out, f"{prefix}.us_per_row", "failed", "no fused row in the output")


def ratio(out, key, num_id, den_id, *files):
    """key = measured[num_id] / measured[den_id] (both already in `files`)."""
    m = read_measured(files or [out])
    a, b = number(m.get(num_id, ("",))[0]), number(m.get(den_id, ("",))[0])
    if a is None or b is None or b == 0:
        emit(out, key, "n/a", f"needs {num_id} and {den_id}")
    else:
        emit(out, key, a / b, f"{num_id} / {den_id}")


def best(out, key, *ids):
    """key = the smallest of measured ids (epoch times); the note names it."""
    m = read_measured([out])
    vals = [(number(m.get(i, ("",))[0]), i) for i in ids]
    vals = [(v, i) for v, i in vals if v is not None]
    if not vals:
        emit(out, key, "n/a", "none of " + ", ".join(ids) + " measured")
        return
    v, i = min(vals)
    emit(out, key, v, i)


def delta(out, key, a_id, b_id):
    """key = measured[a_id] - measured[b_id]."""
    m = read_measured([out])
    a, b = number(m.get(a_id, ("",))[0]), number(m.get(b_id, ("",))[0])
    emit(out, key, "n/a" if a is None or b is None else a - b, f"{a_id} - {b_id}")


def note(out, key, value, text):
    emit(out, key, value, text)


# ---------------------------------------------------------------- the table


def read_predictions(path):
    preds = []
    with open(path, encoding="utf-8") as f:
        header = None
        for line in f:
            line = line.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            cells = line.split("\t")
            if header is None:
                header = cells
                continue
            if len(cells) != len(header):
                sys.exit(f"{path}: line `{line[:60]}`: expected {len(header)} tab-separated fields, found {len(cells)}")
            preds.append(dict(zip(header, cells)))
    return preds


def judge(pred, tol, value):
    """yes / MISS / '' (not judged) for one measured value against one prediction."""
    if value in ("", "n/a", "skipped", None):
        return ""
    if value == "failed":
        return "MISS"
    alts = pred.split("|")
    x = number(value)
    if x is None:
        return "yes" if value in alts else "MISS"
    t = 0.0
    rel = tol.endswith("%")
    if tol not in ("", "-"):
        t = float(tol.rstrip("%")) / (100.0 if rel else 1.0)
    for p in alts:
        p = p.strip()
        try:
            if p.startswith(">="):
                lo = float(p[2:])
                if x >= lo - (abs(lo) * t if rel else t):
                    return "yes"
            elif p.startswith("<="):
                hi = float(p[2:])
                if x <= hi + (abs(hi) * t if rel else t):
                    return "yes"
            elif ".." in p:
                lo, hi = (float(v) for v in p.split(".."))
                w_lo, w_hi = (abs(lo) * t, abs(hi) * t) if rel else (t, t)
                if lo - w_lo <= x <= hi + w_hi:
                    return "yes"
            else:
                c = float(p)
                if abs(x - c) <= (abs(c) * t if rel else t):
                    return "yes"
        except ValueError:
            if str(value) == p:
                return "yes"
    return "MISS"


def card_of(device):
    d = device.lower()
    for c in ("h200", "h100", "a100", "l40", "l4"):
        if c in d:
            return c
    return "host" if "host" in d or "no nvidia-smi" in d else d


def table(preds_path, out_md, header_path, *measured_paths):
    preds = read_predictions(preds_path)
    m = read_measured(measured_paths)
    head = read_text(header_path).strip()
    info = dict(l.split("=", 1) for l in head.splitlines() if "=" in l)
    parts = sorted({p for p in info.get("parts", "").split() if p})
    device = info.get("device", "unknown")
    card = card_of(device)
    dry = info.get("dry", "0") == "1"
    lines = []
    lines.append(f"# GPU verification: part {' + '.join(parts) or '?'} on {device}, {info.get('date', '?')}")
    lines.append("")
    lines.append(f"- command: `{info.get('command', 'bash bench/gpu/verify.sh ' + ' '.join(parts))}`"
                 f" (DEVICE={info.get('DEVICE', '?')}, SCALE={info.get('SCALE', '?')}), wall {info.get('wall', '?')} s")
    lines.append(f"- binaries: {info.get('build', 'unknown build')}")
    lines.append(f"- host: {info.get('host', '?')}")
    lines.append("- predictions: `bench/gpu/predictions.tsv` (reasoning in `docs/records/2026-11-28-predictions.md`);"
                 " a time predicted for another card is judged but marked `other card`: compare ratios there.")
    if dry:
        lines.append("- **dry run** (host backend or small graphs): the figures are not comparable with the"
                     " predictions; `ok?` is computed to exercise the table and reads `dry`.")
    lines.append("")
    lines.append("| id | what | predicted | measured | ok? | source |")
    lines.append("|---|---|---|---|---|---|")
    seen = set()
    misses, unmeasured = [], []
    for p in preds:
        if parts and p["part"] not in parts:
            continue
        seen.add(p["id"])
        value, note = m.get(p["id"], ("not measured", ""))
        unit = p["unit"] if p["unit"] not in ("-", "text", "count", "acc") else ""
        pred = p["predicted"].replace("|", " or ")
        tol = p["tolerance"]
        pred_cell = pred + (f" ±{tol}" if tol not in ("", "-") else "") + (f" {unit}" if unit else "")
        ok = judge(p["predicted"], tol, value) if value != "not measured" else ""
        other = p["card"] not in ("any", card) and unit in ("s", "ms", "us", "GB/s", "M edges/s", "min", "GiB")
        if ok == "MISS" and not other and p["id"] not in misses:
            misses.append(p["id"])
        if value in ("not measured", "skipped", "n/a") and p["id"] not in unmeasured:
            unmeasured.append(p["id"])
        if ok and other:
            ok += " (other card)"
        if ok and dry:
            ok = "dry: " + ok
        meas = value + (f" {unit}" if unit and number(value) is not None else "")
        if note:
            meas += f" ({note})"
        lines.append(f"| `{p['id']}` | {p['what']} | {pred_cell} | {meas} | {ok or '—'} | {p['source']} |")
    extra = [k for k in m if k not in seen]
    if extra:
        lines.append("")
        lines.append("Measured without a prediction:")
        lines.append("")
        lines.append("| id | measured |")
        lines.append("|---|---|")
        for k in extra:
            v, n = m[k]
            lines.append(f"| `{k}` | {v}" + (f" ({n})" if n else "") + " |")
    lines.append("")
    lines.append(f"{len(misses)} miss(es) on this card" + (" (dry run)" if dry else "")
                 + (": " + ", ".join(f"`{i}`" for i in misses) if misses else "") + ".")
    lines.append(f"{len(unmeasured)} prediction(s) not measured (skipped, failed to parse or past the guard)"
                 + (": " + ", ".join(f"`{i}`" for i in unmeasured) if unmeasured else "") + ".")
    with open(out_md + ".tmp", "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    import os
    os.replace(out_md + ".tmp", out_md)
    print(f"wrote {out_md}: {len(seen)} predictions, {len(misses)} miss(es), {len(unmeasured)} not measured")


COMMANDS = {
    "train": train, "peer": peer, "peer-link": peer_link, "tests": tests, "syncs": syncs, "layer-trace": layer_trace,
    "ncu": ncu, "regimes": regimes, "scale": scale, "backend": backend, "hot": hot, "loader": loader,
    "pyg-loader": pyg_loader,
    "ratio": ratio, "best": best, "delta": delta, "note": note, "table": table,
}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        sys.exit("usage: verify.py " + "|".join(COMMANDS) + " ARGS...")
    try:
        COMMANDS[sys.argv[1]](*sys.argv[2:])
    except (OSError, json.JSONDecodeError, ValueError, KeyError) as e:
        # A reader that cannot read its input records that, and the part goes on.
        if sys.argv[1] != "table" and len(sys.argv) > 3:
            emit(sys.argv[2], sys.argv[3] + ".error", "failed", f"{type(e).__name__}: {e}"[:160])
        else:
            raise
