"""Preprocessing throughput at CIFAR-10's full size (60,000 images), generated.

Times ``tasks.preprocess.preprocess_archive`` (safe extraction, parsing and validation, seeded
split, channel statistics, Parquet files written by Dask tasks, manifest) on a synthetic archive
of the real size, into a fresh dataset folder each round.

Run: python benchmarks/preprocess_throughput.py [--rounds 3] [--workers-address tcp://...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

IMAGES = 60_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dask-address", default=None, help="existing cluster (else local)")
    args = parser.parse_args()

    from cifar.format import write_synthetic_archive
    from tasks.download import Archive
    from tasks.layout import StorageLayout
    from tasks.preprocess import preprocess_archive
    from trainlib import DaskConfig

    with tempfile.TemporaryDirectory() as tmp:
        archive = os.path.join(tmp, "cifar-10-python.tar.gz")
        md5 = write_synthetic_archive(archive, images_per_batch=IMAGES // 6)
        print(f"archive: {os.path.getsize(archive) / 1e6:.0f} MB, {IMAGES} images")
        rates = []
        for round_index in range(args.rounds):
            started = time.perf_counter()
            dataset = preprocess_archive(
                Archive(archive, md5, True),
                StorageLayout.at(os.path.join(tmp, f"s{round_index}")),
                dask_config=DaskConfig(address=args.dask_address),
                num_workers=2,
                batch_size=256,
            )
            seconds = time.perf_counter() - started
            total = sum(dataset.manifest.rows(s) for s in ("train", "val", "test"))
            rates.append(total / seconds)
            print(
                f"round {round_index + 1}: {seconds:.1f} s, {rates[-1]:,.0f} images/s", flush=True
            )
        print(f"\nmedian: {statistics.median(rates):,.0f} images/s over {args.rounds} rounds")


if __name__ == "__main__":
    main()
