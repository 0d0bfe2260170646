#!/usr/bin/env python3
"""gpu_report.py -- what each CUDA kernel of a training step asks of an H200, seen without a
GPU: the emulator's per-launch profile (TDD_EMU_PROFILE, backends/cuda/emu/runtime.cpp)
with ptxas's register and shared-memory counts for kernels.cu, against the roofline.

    gpu_report.py run [--build build/emu] [--out bench/gpu_report.md] [--ptxas FILE]
        runs bench/gpu_report_workloads.py's three workloads (the digits MLP, ResNet-18's
        layout, the GPT) each on its own emulated daemon (cuda:0 with 132 SMs, so grids are
        sized as on an H200), profiles the second training step and writes the report
    gpu_report.py report --ptxas FILE NAME=PROFILE.jsonl...
        the report of profiles already taken (run leaves each step's records in
        BUILD/gpu_report_NAME.step.jsonl, NAME one of mlp, resnet18, gpt)

The model, per launch (every figure is the emulator's count unless it says otherwise):
  sector traffic   32 x the distinct 32-byte sectors each warp request touches, summed over
                   requests: the traffic with no cache reuse between requests (an upper
                   bound: a broadcast operand re-read by every row counts every time)
  minimum          the launch's distinct bytes read plus distinct bytes written
  coalescing       the fewest sectors the requests' bytes fit in / the sectors touched
  bank conflicts   shared-memory wavefronts beyond the fewest the bytes need
  FLOPs            counted by the kernel (TDC_FLOPS in kernels.cu) or 2mnk for cuBLAS; 0 for
                   kernels that count none (their time is taken as memory's)
  occupancy        blocks per SM from the block size and ptxas's registers and shared
                   memory (sm_90: 64K registers in 256-register warp granules, 2048 threads,
                   32 blocks, 228 KiB shared memory, 1 KiB reserved per block)
  fill             the warps the grid keeps resident over the 32 per SM that (as a rule of
                   thumb) saturate HBM, capped at 1: a grid of 4 blocks uses 4 of 132 SMs
  estimated time   max(sector traffic / 4.8 TB/s, FLOPs / 67 TFLOP/s (FP32)) / fill
  roofline time    max(minimum / 4.8 TB/s, FLOPs / 67 TFLOP/s); share = roofline / estimate
Launch overhead (a few microseconds each on a GPU) is left out of both.
"""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import OrderedDict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HBM = 4.8e12
FP32 = 67e12
SMS = 132
WORKLOADS = ("mlp", "resnet18", "gpt")
TITLES = {"mlp": "digits MLP (64-128-10, batch 64, Adam)",
          "resnet18": "ResNet-18 layout (widths 16-128, 2x3x32x32, SGD momentum)",
          "gpt": "GPT (2 blocks, d 64, 4 heads, T 32, batch 2, Adam)"}


# ---------------------------------------------------------------- ptxas resource usage

def ptxas_usage(text):
    """{kernel base name: (registers, static shared bytes)} from `nvcc -Xptxas -v` output;
    a template's instantiations fold into the most demanding."""
    entries, cur = {}, None
    for line in text.splitlines():
        m = re.search(r"Compiling entry function '([^']+)'", line)
        if m:
            cur = m.group(1)
            continue
        m = re.search(r"Used (\d+) registers(.*)", line)
        if m and cur:
            smem = re.search(r"(\d+) bytes smem", m.group(2))
            entries[cur] = (int(m.group(1)), int(smem.group(1)) if smem else 0)
            cur = None
    names = list(entries)
    demangled = names
    if names and shutil.which("c++filt"):
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True,
                             text=True).stdout.splitlines()
        if len(out) == len(names):
            demangled = out
    usage = {}
    for mangled, dem in zip(names, demangled):
        base = base_name(dem)
        r, s = entries[mangled]
        pr, ps = usage.get(base, (0, 0))
        usage[base] = (max(pr, r), max(ps, s))
    return usage


def base_name(name):
    """A kernel's identifier: "(anonymous namespace)::bin_contig<2, float>(...)" and
    "bin_contig<TDD_OP_ADD, float>" are both bin_contig."""
    name = re.sub(r"\(anonymous namespace\)::", "", name).strip().lstrip("(")
    name = re.sub(r"^void\s+", "", name)
    m = re.match(r"(?:\w+::)*(\w+)", name)
    return m.group(1) if m else name


def run_ptxas(out_path):
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not os.access(nvcc, os.X_OK):
        return None
    obj = out_path + ".o"
    p = subprocess.run([nvcc, "-O2", "-std=c++17", "-arch=sm_90", "-Xptxas", "-v", "-Iinclude",
                        "-Iproto", "-Ibackends", "-c", "backends/cuda/kernels.cu", "-o", obj],
                       cwd=ROOT, capture_output=True, text=True)
    if os.path.exists(obj):
        os.unlink(obj)
    if p.returncode != 0:
        sys.stderr.write(p.stderr[-2000:])
        return None
    with open(out_path, "w") as f:
        f.write(p.stderr)
    return p.stderr


def occupancy(threads, regs, smem):
    """Resident blocks per SM on sm_90 and the occupancy they give (warps / 64)."""
    warps = (threads + 31) // 32
    by_threads = 2048 // max(threads, 1)
    regs_per_warp = ((max(regs, 1) * 32 + 255) // 256) * 256
    by_regs = 65536 // (regs_per_warp * warps) if warps else 32
    by_smem = (228 * 1024) // (smem + 1024)
    blocks = max(0, min(32, by_threads, by_regs, by_smem))
    return blocks, blocks * warps / 64.0


# ---------------------------------------------------------------- the model

def kind_of(kernel):
    k = kernel.lower()
    if k.startswith("cublas"):
        return "gemm"
    if "sdpa" in k:
        return "attention"
    if any(t in k for t in ("reduce", "softmax", "norm", "loss", "cumsum", "argm", "sum_",
                            "mean", "var", "embedding_bag", "scatter")):
        return "reduction"
    if any(t in k for t in ("im2col", "col2im", "conv", "pool", "interp")):
        return "conv/pool"
    if any(t in k for t in ("bin_", "un_", "ew_", "copy", "cast", "fill", "select", "where",
                            "dropout", "one_hot", "adam", "sgd", "clamp", "gelu", "relu",
                            "arange", "rand", "linspace", "index", "gather", "cat", "pad")):
        return "elementwise"
    return "other"


def launch_figures(rec, usage):
    threads = rec["block"][0] * rec["block"][1] * rec["block"][2]
    blocks = rec["grid"][0] * rec["grid"][1] * rec["grid"][2]
    sec = rec["read_sectors"] + rec["write_sectors"]
    ideal = rec["read_ideal_sectors"] + rec["write_ideal_sectors"]
    traffic = 32 * sec
    minimum = rec["read_unique"] + rec["write_unique"]
    flops = rec["flops"]
    if rec["kernel"].startswith("cublas"):
        occ, fill = 1.0, 1.0
    else:
        regs, smem = usage.get(base_name(rec["kernel"]), (32, 0))
        per_sm, occ = occupancy(threads, regs, smem)
        warps = (threads + 31) // 32
        resident = min(blocks, SMS * max(per_sm, 1)) * warps
        fill = min(1.0, resident / (SMS * 32.0))
    est = max(traffic / HBM, flops / FP32) / max(fill, 1e-9)
    roof = max(minimum / HBM, flops / FP32)
    return {"traffic": traffic, "minimum": minimum, "sectors": sec, "ideal": ideal,
            "flops": flops, "occ": occ, "fill": fill, "est": est, "roof": roof,
            "read_bytes": rec["read_bytes"], "write_bytes": rec["write_bytes"],
            "conflicts": rec["shared_wavefronts"] - rec["shared_ideal_wavefronts"],
            "wavefronts": rec["shared_wavefronts"]}


def summarise(records, usage):
    """Per kernel: launches and the summed figures, in order of first launch."""
    per = OrderedDict()
    for rec in records:
        f = launch_figures(rec, usage)
        a = per.setdefault(rec["kernel"], {"launches": 0, "occ": f["occ"], "fill_min": 1.0})
        a["launches"] += 1
        for k in ("traffic", "minimum", "sectors", "ideal", "flops", "est", "roof",
                  "read_bytes", "write_bytes", "conflicts", "wavefronts"):
            a[k] = a.get(k, 0) + f[k]
        a["occ"] = min(a["occ"], f["occ"])
        a["fill_min"] = min(a["fill_min"], f["fill"])
    return per


def fmt_bytes(n):
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000.0
    return str(n)


def fmt_time(s):
    return f"{s * 1e6:.2f} us" if s < 1e-3 else f"{s * 1e3:.2f} ms"


def table(per):
    lines = ["| kernel | kind | launches | sector traffic | minimum | traffic/min | coalesced "
             "| bank conflicts | FLOPs | occupancy | fill | est. H200 | roofline | share |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    tot = {"traffic": 0, "minimum": 0, "est": 0.0, "roof": 0.0, "flops": 0, "launches": 0}
    for name, a in sorted(per.items(), key=lambda kv: -kv[1]["est"]):
        coal = a["ideal"] / a["sectors"] if a["sectors"] else 1.0
        ratio = a["traffic"] / a["minimum"] if a["minimum"] else 1.0
        share = a["roof"] / a["est"] if a["est"] else 1.0
        lines.append(f"| `{name}` | {kind_of(name)} | {a['launches']} | "
                     f"{fmt_bytes(a['traffic'])} | {fmt_bytes(a['minimum'])} | {ratio:.2f}x | "
                     f"{100 * coal:.0f}% | {a['conflicts']} | {a['flops']:.3g} | "
                     f"{100 * a['occ']:.0f}% | {100 * a['fill_min']:.0f}% | "
                     f"{fmt_time(a['est'])} | {fmt_time(a['roof'])} | {100 * share:.1f}% |")
        for k in tot:
            tot[k] += a[k]
    share = tot["roof"] / tot["est"] if tot["est"] else 1.0
    lines.append(f"| **total** | | {tot['launches']} | {fmt_bytes(tot['traffic'])} | "
                 f"{fmt_bytes(tot['minimum'])} | "
                 f"{tot['traffic'] / max(tot['minimum'], 1):.2f}x | | | {tot['flops']:.3g} | | | "
                 f"{fmt_time(tot['est'])} | {fmt_time(tot['roof'])} | {100 * share:.1f}% |")
    return lines, tot


SMALL = 4096  # a launch's minimum under this: its ratio is mostly sector rounding


def targets(all_per, expected):
    """The issue's targets per kernel: elementwise and reduction kernels >= 90% coalesced and
    <= 1.2x the minimal traffic (kernels whose launches move under 4 KB on average are
    listed, not judged: a 4-byte fill is a 32-byte sector); the attention kernel's FLOPs
    against 2 * (query, key) pairs * (E + Ev), which the workload states."""
    rows = ["| workload | kernel | kind | coalesced | traffic/min | target |",
            "|---|---|---|---:|---:|---|"]
    for wl, per in all_per.items():
        for name, a in sorted(per.items(), key=lambda kv: (kind_of(kv[0]), kv[0])):
            kind = kind_of(name)
            coal = a["ideal"] / a["sectors"] if a["sectors"] else 1.0
            ratio = a["traffic"] / a["minimum"] if a["minimum"] else 1.0
            if kind == "attention" and wl in expected:
                want = expected[wl]
                verdict = (f"FLOPs {a['flops']:.4g} counted, 2 x pairs x (E + Ev) = {want:.4g}: "
                           f"{'met' if a['flops'] <= 1.05 * want else 'MISS'}")
            elif kind not in ("elementwise", "reduction"):
                continue
            elif a["minimum"] / a["launches"] < SMALL:
                verdict = "n/a (under 4 KB a launch)"
            else:
                miss = []
                if coal < 0.9:
                    miss.append("coalescing < 90%")
                if ratio > 1.2:
                    miss.append("traffic > 1.2x")
                verdict = "MISS: " + ", ".join(miss) if miss else "met"
            rows.append(f"| {wl} | `{name}` | {kind} | {100 * coal:.0f}% | {ratio:.2f}x | "
                        f"{verdict} |")
    return rows


def report(profiles, usage, ptxas_note, expected=None):
    out = ["# GPU report: one training step per workload on an emulated H200", "",
           "Made by `make gpu-report` (tools/gpu_report.py; the model is in its docstring). "
           "Traffic, coalescing, bank conflicts and FLOPs are the CUDA emulator's counts "
           "(TDD_EMU_PROFILE) of the second training step; registers and shared memory are "
           f"{ptxas_note}. H200: {HBM / 1e12:.1f} TB/s HBM, {SMS} SMs, "
           f"{FP32 / 1e12:.0f} TFLOP/s FP32. "
           "cuBLAS GEMMs run on the host in the emulator: their traffic is taken as their "
           "operands' and their time as the roofline's.", ""]
    all_per = OrderedDict()
    summary = ["| workload | launches | sector traffic | minimum | traffic/min | FLOPs | "
               "est. H200 | roofline | share |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    sections = []
    for wl, recs in profiles.items():
        per = summarise(recs, usage)
        all_per[wl] = per
        lines, tot = table(per)
        share = tot["roof"] / tot["est"] if tot["est"] else 1.0
        summary.append(f"| {TITLES.get(wl, wl)} | {tot['launches']} | "
                       f"{fmt_bytes(tot['traffic'])} | {fmt_bytes(tot['minimum'])} | "
                       f"{tot['traffic'] / max(tot['minimum'], 1):.2f}x | {tot['flops']:.3g} | "
                       f"{fmt_time(tot['est'])} | {fmt_time(tot['roof'])} | "
                       f"{100 * share:.1f}% |")
        sections += [f"## {TITLES.get(wl, wl)}", "", *lines, ""]
    out += ["## Summary", "", *summary, ""] + sections
    out += ["## Targets (elementwise and reduction kernels, attention)", "",
            *targets(all_per, expected or {}), ""]
    return "\n".join(out) + "\n"


def read_profile(path, start=0):
    recs = []
    with open(path) as f:
        f.seek(start)
        for line in f:
            line = line.strip()
            if line:
                rec = json.loads(line)
                if "kernel" in rec:  # (host waits have lines of their own: "sync")
                    recs.append(rec)
    return recs


# ---------------------------------------------------------------- running the workloads

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_workload(build, wl, prof, timeout):
    if os.path.exists(prof):
        os.unlink(prof)
    env = dict(os.environ, TDD_EMU_PROFILE=prof)
    port = free_port()
    ep = f"tcp://127.0.0.1:{port}"
    log = open(prof + ".log", "w")
    d = subprocess.Popen([os.path.join(build, "tensordd"), "--listen", ep, "--emu-gpus", "1",
                          "--emu-sms", str(SMS), "--emu-gpu-memory", "512M"],
                         stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), 1).close()
                break
            except OSError:
                time.sleep(0.2)
        cenv = dict(os.environ, TDD_EMU_PROFILE_FILE=prof,
                    PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "client", "python"),
                                                os.path.join(build, "python")]))
        cenv.pop("TDD_EMU_PROFILE", None)
        t0 = time.monotonic()
        p = subprocess.run([sys.executable, os.path.join(ROOT, "bench",
                                                         "gpu_report_workloads.py"), ep, wl],
                           env=cenv, capture_output=True, text=True, timeout=timeout)
        if p.returncode != 0:
            raise SystemExit(f"{wl} failed:\n{p.stdout}\n{p.stderr[-3000:]}")
        start = int(re.search(r"step-start (\d+)", p.stdout).group(1))
        m = re.search(r"attention-flops (\d+)", p.stdout)
        sys.stderr.write(f"gpu-report: {wl}: {time.monotonic() - t0:.0f} s\n")
        return start, int(m.group(1)) if m else None
    finally:
        d.send_signal(signal.SIGTERM)
        try:
            d.wait(30)
        except subprocess.TimeoutExpired:
            d.kill()
            d.wait()
        log.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--build", default=os.path.join(ROOT, "build", "emu"))
    r.add_argument("--out", default=os.path.join(ROOT, "bench", "gpu_report.md"))
    r.add_argument("--ptxas", help="saved `nvcc -Xptxas -v` output of kernels.cu")
    r.add_argument("--workloads", default=",".join(WORKLOADS))
    r.add_argument("--timeout", type=int, default=900)
    p = sub.add_parser("report")
    p.add_argument("--ptxas")
    p.add_argument("profiles", nargs="+", help="NAME=PROFILE.jsonl")
    a = ap.parse_args()

    text, note = None, "not known (no ptxas output): 32 registers assumed"
    if a.ptxas:
        if os.path.exists(a.ptxas):
            with open(a.ptxas) as f:
                text = f.read()
    elif a.cmd == "run":
        text = run_ptxas(os.path.join(a.build, "kernels.ptxas.txt"))
    if text:
        note = "ptxas's (nvcc -arch=sm_90 -Xptxas -v on kernels.cu)"
    usage = ptxas_usage(text) if text else {}

    profiles, expected = OrderedDict(), {}
    if a.cmd == "run":
        for wl in a.workloads.split(","):
            prof = os.path.join(a.build, f"gpu_report_{wl}.jsonl")
            start, attn = run_workload(a.build, wl, prof, a.timeout)
            profiles[wl] = read_profile(prof, start)
            with open(os.path.join(a.build, f"gpu_report_{wl}.step.jsonl"), "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in profiles[wl])
            if attn is not None:
                expected[wl] = attn
    else:
        for spec in a.profiles:
            name, path = spec.split("=", 1)
            profiles[name] = read_profile(path)
    md = report(profiles, usage, note, expected)
    sys.stdout.write(md)
    if a.cmd == "run" and a.out:
        with open(a.out, "w") as f:
            f.write(md)


if __name__ == "__main__":
    main()
