"""The class gate's operating figures (``mlops.release_gates.class_drop``): how often an equally
good version passes it, and how often one whose class truly lost 3 or 5 points does, on
CIFAR-10's 1,000 test images a class, at several churns (the share of a class's images that
only one of the two models gets right).

Each draw is one class's paired results from a multinomial: the new model alone right on
churn/2 of the images, the champion alone right on churn/2 plus the drop. An equally good
version passes when all ten classes do.

Run: python benchmarks/class_gate.py [--draws 2000] [--margin 0.04] [--alpha 0.05] [--seed 1]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mlops.release_gates import class_drop

PER_CLASS = 1000
CHURNS = (0.024, 0.05, 0.10, 0.15)


def passes(
    rng: np.random.Generator, churn: float, drop: float, classes: int, margin: float, alpha: float
) -> bool:
    """One draw of ``classes`` classes, the first of them ``drop`` worse: whether it passes."""
    labels = np.repeat(np.arange(classes), PER_CLASS)
    new = np.zeros(labels.size, dtype=bool)
    champion = np.zeros(labels.size, dtype=bool)
    for index in range(classes):
        lost = drop if index == 0 else 0.0
        only_new, only_champion, _ = rng.multinomial(
            PER_CLASS, [churn / 2, churn / 2 + lost, 1 - churn - lost]
        )
        start = index * PER_CLASS
        new[start : start + only_new] = True
        champion[start + only_new : start + only_new + only_champion] = True
    names = [f"class{i}" for i in range(classes)]
    return class_drop(new, champion, labels, names, margin, alpha).passed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=2000)
    parser.add_argument("--margin", type=float, default=0.04)
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    print(f"margin {args.margin:g}, alpha {args.alpha:g}, {PER_CLASS} images a class")
    print("| churn | equally good passes (10 classes) | 3-point drop passes | 5-point drop |")
    print("| --- | --- | --- | --- |")
    for churn in CHURNS:
        equal, three, five = (
            np.mean([passes(rng, churn, drop, classes, args.margin, args.alpha)
                     for _ in range(draws)])
            for drop, classes, draws in (
                (0.0, 10, args.draws // 5), (0.03, 1, args.draws), (0.05, 1, args.draws)
            )
        )  # fmt: skip
        print(f"| {churn:.3f} | {equal:.2f} | {three:.3f} | {five:.3f} |")


if __name__ == "__main__":
    main()
