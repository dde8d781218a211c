"""The model card: a registered version's description, which the MLflow UI shows on the
version's page, so a reviewer reads there what the version is, what it learnt from, how it
scored and why it holds its alias. No Prefect; the text is made from plain values."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cifar.dataset import Dataset
from mlops.paired_test import PairedComparison
from mlops.release_gates import Gate


@dataclass(frozen=True)
class DataFacts:
    """What the version was trained and tested on."""

    digest: str  # the whole dataset's (tag data_digest)
    test_digest: str
    rows: Mapping[str, int]  # images per split
    synthetic: bool


def data_facts(dataset: Dataset) -> DataFacts:
    """The card's data section for ``dataset``."""
    manifest = dataset.manifest
    return DataFacts(
        digest=manifest.digest(),
        test_digest=manifest.digest("test"),
        rows={split: manifest.rows(split) for split in manifest.splits},
        synthetic=manifest.synthetic,
    )


def model_card(
    model_name: str,
    version: str,
    alias: str,
    reason: str,
    *,
    data: DataFacts | None,
    params: Mapping[str, str],
    code: Mapping[str, str],
    accuracy: float,
    per_class: Mapping[str, float],
    champion_per_class: Mapping[str, float] | None,
    gates: Sequence[Gate],
    comparison: PairedComparison | None = None,
    budget_left: float | None = None,
) -> str:
    """The card as Markdown: the decision (with the gain's confidence limits, the verdict and
    the lifetime alpha left, when it was compared with a champion), the data, the training
    configuration and code, the test accuracy per class (beside the champion's on the same
    images) and the release gates."""
    lines = [
        f"# {model_name} version {version}: @{alias}",
        "",
        f"**Decision.** {reason}.",
        "",
    ]
    if comparison is not None:
        lines += [
            "## Against the champion",
            "",
            "| gain | lower limit | upper limit | margin | verdict | alpha spent | alpha left |",
            "|---|---|---|---|---|---|---|",
            f"| {comparison.difference:+.4f} | {comparison.low:+.4f} | {comparison.high:+.4f} "
            f"| {comparison.margin:g} | {comparison.verdict} | {1 - comparison.confidence:.4g} "
            f"| {budget_left if budget_left is not None else float('nan'):.4g} |",
            "",
        ]
    lines += ["## Data"]
    if data is None:
        lines.append("Not recorded.")
    else:
        sizes = ", ".join(f"{split} {count}" for split, count in data.rows.items())
        lines += [
            f"- dataset digest `{data.digest}`, test split digest `{data.test_digest}`",
            f"- images: {sizes}",
            f"- synthetic: {'yes' if data.synthetic else 'no'}",
        ]
    lines += ["", "## Training", "", "| parameter | value |", "|---|---|"]
    lines += [f"| {key} | {value} |" for key, value in sorted(params.items())]
    lines += ["", "Code: " + ", ".join(f"{key} `{value}`" for key, value in code.items()), ""]
    lines += ["## Evaluation on the test split", "", f"Accuracy {accuracy:.4f}.", ""]
    header = "| class | accuracy |" + (" champion |" if champion_per_class else "")
    lines += [header, "|---|---|" + ("---|" if champion_per_class else "")]
    for name, value in per_class.items():
        row = f"| {name} | {value:.3f} |"
        if champion_per_class:
            theirs = champion_per_class.get(name)
            row += f" {theirs:.3f} |" if theirs is not None else " |"
        lines.append(row)
    lines += ["", "## Release gates", "", "| gate | outcome | detail |", "|---|---|---|"]
    lines += [f"| {g.name} | {'passed' if g.passed else 'failed'} | {g.detail} |" for g in gates]
    return "\n".join(lines) + "\n"
