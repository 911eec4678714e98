"""Trainer.fit against `tandem train`: mean epoch time (epochs after the first,
as the CLI's summary line) of one config run both ways, back to back, in one
process tree; prints the ratio Python / CLI for each run.

    python bench/python/fit_vs_cli.py --tandem target/release/tandem [--wordnet wordnet.tds] [--repeat 3]

Runs: the default run (`tandem train` with no config: the built-in 50k-vertex
SBM, GraphSAGE, 10 epochs) and, with --wordnet, examples/configs/wordnet.toml
on that store (`tandem import wordnet -o wordnet.tds`). Each pair alternates
CLI and Python --repeat times; the ratios are of the medians of every epoch
after the first (pooled over the repeats) and of the fastest epochs (the
least disturbed by other work on a shared machine).
"""

import argparse
import pathlib
import re
import statistics
import subprocess
import sys
import time

import tandem

REPO = pathlib.Path(__file__).resolve().parents[2]


def cli_epoch_time(binary, args):
    out = subprocess.run([binary, "train", "--quiet-config", *args], capture_output=True, text=True, check=True)
    m = re.search(r"mean epoch time ([0-9.]+) s", out.stdout)
    if not m:
        raise SystemExit(f"no epoch time in:\n{out.stdout}")
    # The per-epoch lines give more digits than the summary: recompute the mean.
    secs = [float(l.split()[5]) for l in out.stdout.splitlines() if re.match(r"^\s+\d+\s+\d", l)]
    return secs[1:] if len(secs) > 1 else [float(m.group(1))]


def py_epoch_time(config, overrides):
    t = tandem.Trainer(config=config, overrides=overrides)
    recs = t.fit()
    return [r.train_secs for r in recs[1:]]


def run(name, binary, cli_args, config, overrides, repeat):
    cli, py = [], []
    for _ in range(repeat):
        cli += cli_epoch_time(binary, cli_args)
        py += py_epoch_time(config, overrides)
    c, p = statistics.median(cli), statistics.median(py)
    cm, pm = min(cli), min(py)
    print(f"{name}: median CLI {c:.3f} s/epoch, Python {p:.3f} s/epoch, ratio {p / c:.3f}; "
          f"fastest CLI {cm:.3f}, Python {pm:.3f}, ratio {pm / cm:.3f} "
          f"({len(cli)} and {len(py)} epochs)")
    return p / c


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tandem", default=str(REPO / "target" / "release" / "tandem"))
    ap.add_argument("--wordnet", help="a store from `tandem import wordnet -o wordnet.tds`")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    print(f"tandem {tandem.__version__}, python {sys.version.split()[0]}, {time.strftime('%Y-%m-%d')}")
    run("default run", a.tandem, [], None, {}, a.repeat)
    if a.wordnet:
        cfg = str(REPO / "examples" / "configs" / "wordnet.toml")
        run("wordnet", a.tandem, ["--config", cfg, "--set", f'data.path="{a.wordnet}"'], cfg,
            {"data.path": a.wordnet}, a.repeat)


if __name__ == "__main__":
    main()
