"""Ray Data's constructors (``ray.data.read_api``): a ``Dataset`` from files, Python objects,
pandas, NumPy, torch or Dask. Files are read by Dask tasks, one block per file (any fsspec
path or URL, a folder meaning the files in it); objects already in memory are cut into
blocks here."""

from __future__ import annotations

import builtins
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from trainlib.data import _blocks
from trainlib.data.dataset import Dataset, from_frame
from trainlib.errors import DatasetError

if TYPE_CHECKING:
    import pandas as pd
    from dask.dataframe import DataFrame as DaskFrame

_IMAGE_EXTENSIONS = ("png", "jpg", "jpeg", "tif", "tiff", "bmp", "gif")
_DEFAULT_BLOCKS = 8


def range(n: int, *, override_num_blocks: int | None = None) -> Dataset:
    """Rows ``{"id": 0}`` to ``{"id": n - 1}``."""
    import pandas as pd

    return from_frame(pd.DataFrame({"id": np.arange(n)}), _blocks_for(n, override_num_blocks))


def from_items(items: list[Any], *, override_num_blocks: int | None = None) -> Dataset:
    """A row per item: the item if it is a dict, else ``{"item": item}``."""
    rows = [item if isinstance(item, dict) else {"item": item} for item in items]
    return from_frame(_blocks.frame(rows), _blocks_for(len(rows), override_num_blocks))


def from_pandas(dfs: pd.DataFrame | list[pd.DataFrame]) -> Dataset:
    """A block per DataFrame."""
    frames = dfs if isinstance(dfs, list) else [dfs]
    return Dataset([_blocks.delayed(_blocks.frame(f)) for f in frames])


def from_numpy(ndarrays: np.ndarray | list[np.ndarray]) -> Dataset:
    """A row per entry of each array's first axis, as ``{"data": entry}``; a block per array."""
    arrays = ndarrays if isinstance(ndarrays, list) else [ndarrays]
    return Dataset([_blocks.delayed(_blocks.frame({"data": np.asarray(a)})) for a in arrays])


def from_torch(dataset: Any) -> Dataset:
    """A row per item of a torch map-style ``Dataset``, as ``{"item": item}``."""
    return from_items([{"item": dataset[i]} for i in builtins.range(len(dataset))])


def from_dask(df: DaskFrame) -> Dataset:
    """A block per partition of a Dask DataFrame."""
    return Dataset(df.to_delayed())


def read_csv(paths: str | list[str], **read_args: Any) -> Dataset:
    """A block per CSV file (``pandas.read_csv``'s arguments)."""
    return _read(paths, ("csv",), _csv, read_args)


def read_parquet(paths: str | list[str], *, columns: list[str] | None = None, **kw: Any) -> Dataset:
    """A block per Parquet file, its ``columns`` only if given."""
    return _read(paths, ("parquet",), _parquet, {"columns": columns, **kw})


def read_json(paths: str | list[str], *, lines: bool = True, **read_args: Any) -> Dataset:
    """A block per JSON file: JSON lines by default, as Ray reads ``.jsonl``."""
    return _read(paths, ("json", "jsonl"), _json, {"lines": lines, **read_args})


def read_text(
    paths: str | list[str],
    *,
    encoding: str = "utf-8",
    drop_empty_lines: bool = True,
    include_paths: bool = False,
    file_extensions: Sequence[str] | None = None,
    **hints: Any,
) -> Dataset:
    """A row per line of each text file, ``{"text": line}`` (and ``"path"``), empty lines
    dropped unless ``drop_empty_lines=False``; a block per file."""
    options = {"encoding": encoding, "drop": drop_empty_lines, "include_paths": include_paths}
    return _read(paths, tuple(file_extensions or ()), _text, options)


def read_binary_files(
    paths: str | list[str],
    *,
    include_paths: bool = False,
    file_extensions: Sequence[str] | None = None,
    **hints: Any,
) -> Dataset:
    """A row per file, ``{"bytes": its contents}`` (and ``"path"`` with ``include_paths``)."""
    options = {"include_paths": include_paths}
    return _read(paths, tuple(file_extensions or ()), _binary, options, per_file=False)


def read_numpy(paths: str | list[str], **hints: Any) -> Dataset:
    """A row per entry of each ``.npy`` file's first axis, as ``{"data": entry}``."""
    return _read(paths, ("npy",), _numpy, {})


def from_arrow(tables: Any) -> Dataset:
    """A block per pyarrow ``Table`` (one or a list)."""
    return from_pandas([t.to_pandas() for t in (tables if isinstance(tables, list) else [tables])])


def read_images(
    paths: str | list[str],
    *,
    size: tuple[int, int] | None = None,
    mode: str | None = None,
    include_paths: bool = False,
    file_extensions: Sequence[str] | None = _IMAGE_EXTENSIONS,
    **hints: Any,
) -> Dataset:
    """A row per image file: ``{"image": array (H, W, C) uint8}`` (and ``"path"`` with
    ``include_paths``); resized to ``size`` (height, width) and converted to ``mode`` (PIL's,
    e.g. ``"RGB"``) when given."""
    options = {"size": size, "mode": mode, "include_paths": include_paths}
    return _read(paths, tuple(file_extensions or ()), _images, options, per_file=False)


def _read(
    paths: str | list[str],
    extensions: tuple[str, ...],
    reader: Callable[..., pd.DataFrame],
    options: dict[str, Any],
    per_file: bool = True,
) -> Dataset:
    import fsspec

    listed = []
    for path in [paths] if isinstance(paths, str) else list(paths):
        filesystem, root = fsspec.core.url_to_fs(path)
        if not filesystem.exists(root):
            raise DatasetError(
                f"{path!r} does not exist or cannot be reached: give a file, a folder or a URL."
            )
        if filesystem.isdir(root):
            found = sorted(
                f
                for f in filesystem.find(root)
                if not extensions or f.lower().rsplit(".", 1)[-1] in extensions
            )
            listed += [(filesystem, f) for f in found]
        else:
            listed.append((filesystem, root))
    if not listed:
        raise DatasetError(f"No {'/'.join(extensions)} files under {paths!r}.")
    if per_file:
        return Dataset([_blocks.delayed(reader)(fs, f, options) for fs, f in listed])
    groups = np.array_split(np.arange(len(listed)), _blocks_for(len(listed), None))
    return Dataset(
        [_blocks.delayed(reader)([listed[i] for i in g], options) for g in groups if len(g)]
    )


def _csv(filesystem: Any, path: str, options: dict[str, Any]) -> pd.DataFrame:
    import pandas as pd

    with filesystem.open(path, "rb") as f:
        return pd.read_csv(f, **options)


def _parquet(filesystem: Any, path: str, options: dict[str, Any]) -> pd.DataFrame:
    """A Parquet file's rows; a column of fixed-size lists (a tensor column) as one array of
    its element type per row, as Ray's tensor columns read."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    with filesystem.open(path, "rb") as f:
        table = pq.read_table(f, **options)
    columns: dict[str, Any] = {}
    for name in table.column_names:
        column, shape, kind = table.column(name).combine_chunks(), [], table.schema.field(name)
        kind = kind.type
        while pa.types.is_fixed_size_list(kind):
            shape.append(kind.list_size)
            kind = kind.value_type
        if not shape:
            columns[name] = column.to_pandas()
            continue
        flat = column
        for _ in shape:
            flat = flat.flatten()
        values = flat.to_numpy(zero_copy_only=False).reshape(len(column), *shape)
        columns[name] = list(values)
    return pd.DataFrame(columns)


def _json(filesystem: Any, path: str, options: dict[str, Any]) -> pd.DataFrame:
    import pandas as pd

    with filesystem.open(path, "rb") as f:
        return pd.read_json(f, **options)


def _text(filesystem: Any, path: str, options: dict[str, Any]) -> pd.DataFrame:
    with filesystem.open(path, "rb") as f:
        lines = f.read().decode(options["encoding"]).splitlines()
    rows = [{"text": line} for line in lines if line or not options["drop"]]
    if options["include_paths"]:
        rows = [{**row, "path": path} for row in rows]
    return _blocks.frame(rows) if rows else _blocks.frame({"text": np.array([], dtype=object)})


def _binary(files: list[tuple[Any, str]], options: dict[str, Any]) -> pd.DataFrame:
    rows = []
    for filesystem, path in files:
        row: dict[str, Any] = {"bytes": filesystem.cat_file(path)}
        rows.append({**row, "path": path} if options["include_paths"] else row)
    return _blocks.frame(rows)


def _numpy(filesystem: Any, path: str, options: dict[str, Any]) -> pd.DataFrame:
    with filesystem.open(path, "rb") as f:
        return _blocks.frame({"data": np.load(f, allow_pickle=False)})


def _images(files: list[tuple[Any, str]], options: dict[str, Any]) -> pd.DataFrame:
    from PIL import Image

    rows = []
    for filesystem, path in files:
        with filesystem.open(path, "rb") as f:
            image: Image.Image = Image.open(f)
            if options["mode"]:
                image = image.convert(options["mode"])
            if options["size"]:
                height, width = options["size"]
                image = image.resize((width, height))
            row: dict[str, Any] = {"image": np.asarray(image)}
        if options["include_paths"]:
            row["path"] = path
        rows.append(row)
    return _blocks.frame(rows)


def _blocks_for(rows: int, asked: int | None) -> int:
    return max(1, min(asked or _DEFAULT_BLOCKS, rows or 1))
