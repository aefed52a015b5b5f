"""One forward of `kdtree-engine bench` kernel by kernel, from Nsight Compute's CSV.

Input: `ncu --metrics gpu__time_duration.sum --graph-profiling node --csv kdtree-engine bench ...`
(scripts/gpu-check.sh --bench). A forward runs from an embedding kernel to the next argmax kernel;
the last whole one is summed per kernel name, largest first. ncu serialises kernels and flushes
caches between them, so the sum is above a graph replay's time.
"""

import collections
import csv
import sys

# Microseconds per unit of ncu's duration metric.
US_PER = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}


def kernel_times(path):
    """(launch id, kernel name, microseconds) of every profiled launch, in launch order."""
    header, times = None, []
    for row in csv.reader(open(path)):
        if "Kernel Name" in row and "Metric Value" in row:
            header = row
        elif header and len(row) == len(header):
            d = dict(zip(header, row))
            if d.get("Metric Name") != "gpu__time_duration.sum":
                continue
            value = float(d["Metric Value"].replace(",", ""))
            times.append((int(d["ID"]), d["Kernel Name"], value * US_PER.get(d.get("Metric Unit", "ns"), 1e-3)))
    return sorted(times)


def forwards(times):
    """The launches of each whole forward: an embedding kernel through the next argmax kernel."""
    done, current = [], None
    for _, name, us in times:
        if "embedding" in name:
            current = []
        if current is not None:
            current.append((name, us))
            if "argmax" in name:
                done.append(current)
                current = None
    return done


def main(path):
    times = kernel_times(path)
    found = forwards(times)
    if not found:
        sys.exit(f"{path}: no whole forward among {len(times)} profiled kernels")
    last = found[-1]
    per_name = collections.defaultdict(lambda: [0, 0.0])
    for name, us in last:
        entry = per_name[name.split("(")[0][:80]]
        entry[0] += 1
        entry[1] += us
    print(f"one forward: {len(last)} kernels, {sum(us for _, us in last):.1f} us ({len(found)} forwards profiled)")
    for name, (count, us) in sorted(per_name.items(), key=lambda kv: -kv[1][1]):
        print(f"{us:9.1f} us {count:4d}x  {name}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: ncu-forward.py NCU_CSV")
    main(sys.argv[1])
