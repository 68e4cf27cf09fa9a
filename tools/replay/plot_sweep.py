#!/usr/bin/env python3
"""Plot a dhs-replay sweep: output throughput against concurrency.

Usage: plot_sweep.py SWEEP.csv OUT.png

SWEEP.csv is what `dhs-replay --sweep C1,C2,... --plot OUT.png` writes (columns concurrency,
output_tokens_per_s, ...; see docs/replay.md). Exit status: 0 written, 2 bad usage or input,
3 matplotlib missing (Debian: apt-get install python3-matplotlib).
"""
import csv
import sys


def main(argv):
    if len(argv) != 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    csv_path, png_path = argv[1], argv[2]
    try:
        import matplotlib
        matplotlib.use("Agg")  # files only, no display
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_sweep.py: matplotlib is missing; install python3-matplotlib", file=sys.stderr)
        return 3
    points = []
    try:
        with open(csv_path, newline="") as f:
            for row in csv.DictReader(f):
                points.append((int(row["concurrency"]), float(row["output_tokens_per_s"])))
    except (OSError, KeyError, ValueError) as e:
        print(f"plot_sweep.py: cannot read {csv_path}: {e}", file=sys.stderr)
        return 2
    if not points:
        print(f"plot_sweep.py: {csv_path} has no rows", file=sys.stderr)
        return 2
    points.sort()
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([c for c, _ in points], [t for _, t in points], marker="o")
    ax.set_xlabel("concurrency (requests in flight)")
    ax.set_ylabel("output tokens/s")
    ax.set_title("dhs-replay sweep: throughput against concurrency")
    ax.grid(True, alpha=0.3)
    ax.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
