"""Our ``piper`` DP against the published C++ Piper (github.com/msr-fiddle/piper, ``algo.cpp``) on the
same instances: seconds (best of ``--repeat``, the two interleaved) and the ratio original / ours.

    python benchmarks/piper_vs_original.py --original /path/to/piper_driver --inputs /path/to/piper/inputs
    python benchmarks/piper_vs_original.py --original ... --inputs ... --cases bert32a100:512:8

The published program runs its paper's experiments from a fixed ``main()``; to time one instance it
is compiled with the small driver below (our code: it includes ``algo.cpp`` with its ``main``
renamed, sets devices, memory, bandwidth and micro-batches from the command line, and times the
published ``Graph(ins)`` + ``runDP()`` — downset enumeration and the DP, JSON parsing excluded).
Without ``--original`` this script prints how to build it and exits 2.  Our side times
``count_downsets`` + ``build_instance`` + ``run_dp`` in ``mode="piper"`` (import excluded) in this
process.  Beside wall seconds the table shows the ratio of CPU seconds (ours: this process's;
the original's: the child's, its JSON parsing included), steadier on a loaded machine.  Both must reach the same objective (relative 1e-9), else the row says so and the exit
status is 1.  Default cases: BERT-32 (``bert32a100.json``) at 8, 64 and 512 devices with the
published ``single()`` setting (8 GiB, 1,920 micro-batches), GNMT at 8 devices / 1.2 GiB and
ResNet-50 at 16 devices / 2 GiB (published experiments' pairs, the files' micro-batch counts);
bandwidth 25 GiB/s everywhere.  Not run in CI (it needs the C++ build and minutes of CPU).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time

GiB = 2**30
DEFAULT_CASES = ["bert32a100:8:8", "bert32a100:64:8", "bert32a100:512:8", "gnmt:8:1.2", "resnet:16:2"]

DRIVER = r"""// Times the published Piper DP on one instance: driver INPUT DEVICES MEMORY BANDWIDTH MICRO_BATCHES
#include <chrono>
#define main piper_published_main
#include "algo.cpp"
#undef main

int main(int argc, char **argv) {
    if (argc < 6) {
        std::cerr << "usage: driver INPUT.json DEVICES MEMORY_BYTES BANDWIDTH MICRO_BATCHES" << std::endl;
        return 2;
    }
    json j;
    std::ifstream f(argv[1]);
    f >> j;
    Instance ins = j.get<Instance>();
    ins.maxDevices = std::atoi(argv[2]);
    ins.maxMemoryPerDevice = std::atof(argv[3]);
    ins.bandwidth = std::atof(argv[4]);
    ins.mbsInBatch = std::atoi(argv[5]);
    auto t0 = std::chrono::steady_clock::now();
    Graph g(ins);
    Result r = g.runDP();
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double tps = r.stages.empty() ? -1.0 : g.getTPSForResult(r);
    int devices = 0, s = 0;
    for (const ResultStage &st : r.stages) {
        devices += st.dataParallelDegree * st.tensorParallelDegree;
        s += st.dataParallelDegree;
    }
    std::cout << std::setprecision(17) << "{\"seconds\": " << secs << ", \"value\": " << tps
              << ", \"devices\": " << devices << ", \"s\": " << s << "}" << std::endl;
    return 0;
}
"""

BUILD = """No --original binary given.  To build one (the published code stays outside this repository):

  git clone https://github.com/msr-fiddle/piper /tmp/piper
  python benchmarks/piper_vs_original.py --write-driver /tmp/piper/driver.cpp
  g++ -O3 -std=c++17 -I/tmp/piper /tmp/piper/driver.cpp -o /tmp/piper/piper_driver
  python benchmarks/piper_vs_original.py --original /tmp/piper/piper_driver --inputs /tmp/piper/inputs
"""


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_original(binary: str, path: str, devices: int, memory: float, bandwidth: float, n: int) -> dict:
    cpu = _children_cpu()
    out = subprocess.run(
        [binary, path, str(devices), repr(memory), repr(bandwidth), str(n)], capture_output=True, text=True, check=True
    ).stdout
    res = json.loads(out.strip().splitlines()[-1])
    res["cpu"] = _children_cpu() - cpu
    return res


def run_ours(graph, devices: int, memory: float, bandwidth: float, n: int) -> dict:
    from gpp_solver.planners.piper.dp import run_dp
    from gpp_solver.planners.piper.planner import build_instance, count_downsets
    from gpp_solver.types import Cluster

    t0, cpu = time.perf_counter(), time.process_time()
    cluster = Cluster(devices=devices, memory_bytes=memory, inter_node_bandwidth=bandwidth)
    inst = build_instance(graph, cluster, n, mode="piper")
    res = run_dp(inst, count_downsets(graph))
    secs = time.perf_counter() - t0
    return {
        "seconds": secs,
        "cpu": time.process_time() - cpu,
        "value": res.value if math.isfinite(res.value) else -1.0,
        "devices": res.devices,
        "s": res.s,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--original", help="the driver binary built from the published algo.cpp (see --write-driver)")
    ap.add_argument("--inputs", help="folder holding the published inputs (bert32a100.json, gnmt.json, resnet.json)")
    ap.add_argument(
        "--cases",
        nargs="+",
        default=DEFAULT_CASES,
        metavar="FILE:DEVICES:GIB",
        help=f"input stem, devices, memory in GiB (default: {' '.join(DEFAULT_CASES)})",
    )
    ap.add_argument("--repeat", type=int, default=3, help="runs of each side per case; best shown (default 3)")
    ap.add_argument("--bandwidth-gib", type=float, default=25.0, help="bandwidth in GiB/s (default 25)")
    ap.add_argument("--write-driver", metavar="PATH", help="write the C++ driver's source to PATH and exit")
    args = ap.parse_args(argv)
    if args.write_driver:
        with open(args.write_driver, "w") as f:
            f.write(DRIVER)
        print(f"wrote {args.write_driver}; build it beside algo.cpp with g++ -O3 -std=c++17")
        return 0
    if not args.original or not args.inputs:
        print(BUILD, file=sys.stderr)
        return 2
    from gpp_solver.formats.piper import import_piper

    bandwidth = args.bandwidth_gib * GiB
    print(
        f"{'case':22} {'original s':>11} {'ours s':>9} {'orig/ours':>9} {'cpu orig/ours':>13}  "
        "objective (original / ours)",
        flush=True,
    )
    status = 0
    for case in args.cases:
        stem, devices, gib = case.split(":")
        path = os.path.join(args.inputs, stem + ".json")
        with open(path) as f:
            n = int(json.load(f)["mbsInBatch"])
        graph = import_piper(path)
        memory = float(gib) * GiB
        orig, ours = [], []
        for _ in range(args.repeat):  # interleaved, so both see the same load
            orig.append(run_original(args.original, path, int(devices), memory, bandwidth, n))
            ours.append(run_ours(graph, int(devices), memory, bandwidth, n))
        to, tu = min(r["seconds"] for r in orig), min(r["seconds"] for r in ours)
        co, cu = min(r["cpu"] for r in orig), min(r["cpu"] for r in ours)
        vo, vu = orig[0]["value"], ours[0]["value"]
        same = math.isclose(vo, vu, rel_tol=1e-9, abs_tol=0.0)
        status |= not same
        print(
            f"{case:22} {to:11.3f} {tu:9.3f} {to / tu:9.2f} {co / cu:13.2f}  {vo:.10g} / {vu:.10g}"
            f"{'' if same else '  DIFFERENT'}",
            flush=True,
        )
    return status


if __name__ == "__main__":
    sys.exit(main())
