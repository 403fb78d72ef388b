"""The Batch API runner's per-line database cost as a batch grows: how long ``claim()`` (the next
pending line, leased) and ``finalize_if_done()`` (is anything pending?) take on a batch whose
first lines are already done, on a fresh SQLite file in a temporary folder. A claim that
walked every finished line made a 50,000-line batch's runner quadratic.

    python bench/batch_claim.py [--sizes 1000,10000,50000] [--calls 200]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,50000")
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    os.environ["SUPERFLUID_DATA_DIR"] = tempfile.mkdtemp(prefix="superfluid-bench-claim-")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "superfluid_site.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from batches import runner
    from batches.models import Batch, File, Line

    print(f"{'lines':>7} | {'done before':>11} | {'claim ms (median)':>17} | {'finalize check ms (median)':>26}")
    print(f"{'--:':>7} | {'--:':>11} | {'--:':>17} | {'--:':>26}")
    for size in (int(s) for s in args.sizes.split(",")):
        f = File.objects.create(purpose="batch", filename="in.jsonl", bytes=1, content=b"x", owner="bench")
        b = Batch.objects.create(endpoint="/v1/completions", input_file=f, owner="bench", total=size)
        done = size - args.calls - 1
        Line.objects.bulk_create(
            [Line(batch=b, index=i, custom_id=f"c{i}", body={}, done=i < done, ok=i < done) for i in range(size)], batch_size=2000
        )
        runner.begin(b.id)
        claims, checks = [], []
        for _ in range(args.calls):
            t0 = time.perf_counter()
            line = runner.claim(b.id)
            claims.append(time.perf_counter() - t0)
            assert line is not None and line.index >= done
            t0 = time.perf_counter()
            runner.finalize_if_done(b.id)
            checks.append(time.perf_counter() - t0)
        print(f"{size:>7} | {done:>11} | {statistics.median(claims) * 1000:>17.3f} | {statistics.median(checks) * 1000:>26.3f}")


if __name__ == "__main__":
    main()
